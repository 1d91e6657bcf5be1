-- MULTI_FENCE: raise the fencing counters of one hash slot to a holding's fence.
--
-- ARGV[1] fence: the holding's fence (drawn in another slot, and larger)
-- KEYS[1...] fences: the fencing counters of the holding's names in this slot
-- return how many counters were raised (a counter above the fence is left alone)
local fence = tonumber(ARGV[1])
local raised = 0
for i = 1, #KEYS do
    local now = tonumber(redis.call('GET', KEYS[i]) or '0')
    if now < fence then
        redis.call('SET', KEYS[i], ARGV[1])
        raised = raised + 1
    end
end
return raised
