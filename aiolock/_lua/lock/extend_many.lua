-- EXTEND_MANY: EXTEND for many holdings of one slot in one call (batched renewal).
--
-- KEYS[1...] locks: each holding's lock key
-- ARGV[1] ms: the new lease of every holding, in milliseconds
-- ARGV[2] suffix: the queue's suffix (a holding's queue is its key followed by it)
-- ARGV[3...] tokens: each holding's token, in the order of KEYS
-- return the positions (from 1) of the holdings not renewed, in order: their key was
--     gone or someone else's (another kind's key, which MGET reads as nil, included).
--     Usually empty: the reply does not grow with the batch.
--
-- The cost is what renewing thousands of held locks costs the server, so it is kept to
-- the least an owner-checked renewal needs: one MGET reads every key, one PEXPIRE per
-- holding still ours resets its lease, and one EXISTS over their queues tells whether
-- any has one (few do); only then is each queue kept, as EXTEND keeps it, for the new
-- lease plus its slack (redis.pcall: a queue in a slot that migrates is skipped).
local values = redis.call('MGET', unpack(KEYS))
local ms = ARGV[1]
local suffix = ARGV[2]
local lost = {}
local queues = {}
for i = 1, #KEYS do
    if values[i] ~= ARGV[i + 2] or redis.call('PEXPIRE', KEYS[i], ms) ~= 1 then
        lost[#lost + 1] = i
    else
        queues[#queues + 1] = KEYS[i] .. suffix
    end
end
if #queues > 0 then
    local ok, found = pcall(redis.call, 'EXISTS', unpack(queues))
    if not ok or found > 0 then
        local life = tonumber(ms) + QUEUE_SLACK_MS
        for _, queue in ipairs(queues) do
            redis.pcall('PEXPIRE', queue, life)
        end
    end
end
return lost
