-- MULTI_ACQUIRE: take the locks of several names of one hash slot at once, or none.
--
-- ARGV[1] token: the caller's token
-- ARGV[2] ms: the lease in milliseconds
-- ARGV[3] fencing: '1' to draw a fence for the holding
-- ARGV[4] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[5...] channels: each name's release channel, in order
-- KEYS[1...] names: for each name in order, its lock key, its queue and its fencing
--     counter (three keys a name)
-- return {1, fence} when the caller holds every lock now: each key holds its token
--     with a lease of ms (run again after it took them, as after a lost reply, it
--     answers the same). With fencing, every name's counter moves to the same fence:
--     one more than the largest of them (next_fence), so it is above every fence any
--     of the names had and below every later one; without, fence is 0. Otherwise
--     nothing is taken (a key already holding the token is given back) and the reply
--     is {0, pttl, i}: name i (its number in order, from 1) keeps the caller out
--     longest, for pttl ms: its holder's remaining lease (-1: a key without expiry),
--     or, for a free lock whose queue holds waiters of an ordinary lock (they go
--     first), the queue's remaining life. {-1, i}: the key of name i is another kind
--     of primitive's (WRONGTYPE).
--@include fence
--@include announce

local token = ARGV[1]
local count = #KEYS / 3
local longest = nil
local which = 0
local mine = {}
for i = 1, count do
    local lock = KEYS[3 * i - 2]
    local holder = redis.pcall('GET', lock)
    if type(holder) == 'table' and holder.err then
        return {-1, i}
    end
    local wait = nil
    if holder == token then
        table.insert(mine, i)
    elseif holder then
        wait = redis.call('PTTL', lock)
    else
        wait = redis.call('PTTL', KEYS[3 * i - 1])
    end
    if wait and wait ~= -2 then
        if longest == nil or (longest ~= -1 and (wait == -1 or wait > longest)) then
            longest = wait
            which = i
        end
    end
end
if longest ~= nil then
    for _, i in ipairs(mine) do
        redis.call('DEL', KEYS[3 * i - 2])
        announce(ARGV[4 + i], ARGV[4], '')
    end
    return {0, longest, which}
end
for i = 1, count do
    redis.call('SET', KEYS[3 * i - 2], token, 'PX', ARGV[2])
end
if ARGV[3] ~= '1' then
    return {1, 0}
end
local fence = 0
for i = 1, count do
    local drawn = next_fence(KEYS[3 * i])
    if drawn > fence then
        fence = drawn
    end
end
local text = string.format('%d', fence)
for i = 1, count do
    redis.call('SET', KEYS[3 * i], text)
end
return {1, fence}
