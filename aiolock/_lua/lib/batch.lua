-- extend_each(extend): run a kind's `extend(key, token, ms, queue)` for every holding of
-- a batch, as the kinds' *_EXTEND_MANY scripts take it: KEYS[i] the i-th holding's
-- key, ARGV[i + 2] its token, ARGV[1] the lease of all (ms), its queue its key followed
-- by ARGV[2], the kind's queue suffix. Returns the holdings not renewed, in order, as
-- EXTEND_MANY does: i (from 1) where extend answered 0, or where it met a key of
-- another type (WRONGTYPE: someone else's); -i where it failed with an error that says
-- nothing of whose the key is (a slot migrating): that one is tried again. Either way
-- the others go on.
local function extend_each(extend)
    local failed = {}
    local ms = ARGV[1]
    local suffix = ARGV[2]
    for i = 1, #KEYS do
        local ok, extended = pcall(extend, KEYS[i], ARGV[i + 2], ms, KEYS[i] .. suffix)
        if not ok then
            local text = extended
            if type(text) == 'table' then
                text = text.err or ''
            end
            if string.find(tostring(text), 'WRONGTYPE', 1, true) then
                failed[#failed + 1] = i
            else
                failed[#failed + 1] = -i
            end
        elseif extended ~= 1 then
            failed[#failed + 1] = i
        end
    end
    return failed
end
