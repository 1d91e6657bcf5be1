-- STATUS_INSPECT: who holds a name and who waits for it, read only (aiolock.inspect).
--
-- KEYS[1] lock: the name's key
-- KEYS[2] fence: its fencing counter
-- KEYS[3] queue: a lock's queue
-- KEYS[4] semaphore_queue: a semaphore's queue
-- KEYS[5] rw_queue: a read-write lock's queue
-- ARGV[1] most: the most waiters read from each queue
-- return {the server's clock in ms (a string), the key's type ('string', 'zset',
--     'hash' or 'none'), the holders, the waiters, the fence counter or false}. The
--     holders are a flat list of (token, role, ms its lease has left): role '' for a
--     lock's holder (ms -1: no expiry), 'p' a permit, 'r' a reader, 'w' the writer; a
--     holder whose lease is over is left out. The waiters are a flat list of (the
--     queue's number, 1 to 3 as KEYS[3] to KEYS[5], token): the live ones only, in
--     the order they will be served. Nothing is written.
--@include clock
--@include entry

local now = now_ms()
local kind = redis.call('TYPE', KEYS[1])['ok']
local holders = {}
local function add(token, role, ms)
    holders[#holders + 1] = token
    holders[#holders + 1] = role
    holders[#holders + 1] = tostring(ms)
end
if kind == 'string' then
    add(redis.call('GET', KEYS[1]), '', redis.call('PTTL', KEYS[1]))
elseif kind == 'zset' then
    local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
    for i = 1, #members, 2 do
        add(members[i], 'p', tonumber(members[i + 1]) - now)
    end
elseif kind == 'hash' then
    local fields = redis.call('HGETALL', KEYS[1])
    for i = 1, #fields, 2 do
        local token, value = fields[i], fields[i + 1]
        if string.sub(token, 1, 1) ~= '=' then  -- ('=w' names the writer)
            local ends = tonumber(string.sub(value, 2))
            if ends and ends > now then
                add(token, string.sub(value, 1, 1), ends - now)
            end
        end
    end
end

-- A waiter is alive while its entry exists, and a kept entry while its keeper's mark does.
local waiters = {}
local most = tonumber(ARGV[1]) - 1
for number, queue in ipairs({KEYS[3], KEYS[4], KEYS[5]}) do
    local tokens = {}
    if redis.call('TYPE', queue)['ok'] == 'list' then  -- (else not aiolock's)
        tokens = redis.call('LRANGE', queue, 0, most)
    end
    for _, token in ipairs(tokens) do
        local value = redis.call('GET', queue .. ':' .. token)
        if value then
            local keeper = select(5, parse_entry(value))
            if not keeper or keeper == '' or redis.call('EXISTS', queue .. ':@' .. keeper) == 1 then
                waiters[#waiters + 1] = tostring(number)
                waiters[#waiters + 1] = token
            end
        end
    end
end
return {tostring(now), kind, holders, waiters, redis.call('GET', KEYS[2]) or false}
