-- KEEP: a client's waiters on one name, kept alive together by its keeper.
--
-- KEYS[1] queue: the queue
-- ARGV[1] keeper: the keeper's id
-- ARGV[2] drop: how many of the tokens are those whose entries to delete (their calls
--     ended); they come first
-- ARGV[3] extend: how many tokens follow those whose entries to extend by life
-- ARGV[4] life: a kept entry's own life (ms)
-- ARGV[5...] tokens: the tokens to delete, then to extend, then only to look at
-- return, for each token extended or looked at, in order, 1 if its entry is there,
--     else 0 (gone: granted, or lost). Sets the keeper's mark (its entries are alive
--     while it lives) for KEEPER_MARK_MS, deletes the first entries, extends the next,
--     and looks at the rest. One MGET looks at all: the cost does not grow with the
--     waiters.

local queue = KEYS[1]
redis.call('SET', queue .. ':@' .. ARGV[1], '1', 'PX', KEEPER_MARK_MS)
local drop = tonumber(ARGV[2])
local extend = tonumber(ARGV[3])
local first = 5
if drop > 0 then
    local doomed = {}
    for i = first, first + drop - 1 do
        doomed[#doomed + 1] = queue .. ':' .. ARGV[i]
    end
    redis.call('DEL', unpack(doomed))
end
first = first + drop
local found = {}
for i = first, first + extend - 1 do
    found[#found + 1] = redis.call('PEXPIRE', queue .. ':' .. ARGV[i], ARGV[4])
end
first = first + extend
if first <= #ARGV then
    local looked = {}
    for i = first, #ARGV do
        looked[#looked + 1] = queue .. ':' .. ARGV[i]
    end
    for _, value in ipairs(redis.call('MGET', unpack(looked))) do
        found[#found + 1] = value and 1 or 0
    end
end
return found
