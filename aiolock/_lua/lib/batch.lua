-- extend_each(extend): run a kind's `extend(key, token, ms, queue)` for every holding
-- of a batch: KEYS[i] the i-th holding's key, ARGV[2i] and ARGV[2i+1] its token and
-- lease (ms), its queue its key followed by ARGV[1], the kind's queue suffix. Returns
-- one reply per holding: extend's 1 or 0, or -1 if its extend failed with an error
-- that says nothing of whose the key is (a slot migrating): that one is tried again. A
-- holding whose key is of another type (WRONGTYPE: someone else's) answers 0. Either
-- way the others go on.
local function extend_each(extend)
    local done = {}
    for i = 1, #KEYS do
        local ok, extended = pcall(
            extend, KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], KEYS[i] .. ARGV[1]
        )
        if ok then
            done[i] = extended
        else
            local text = extended
            if type(text) == 'table' then
                text = text.err or ''
            end
            if string.find(tostring(text), 'WRONGTYPE', 1, true) then
                done[i] = 0
            else
                done[i] = -1
            end
        end
    end
    return done
end
