--@include clock
--@include tell
--@include queue
-- A read-write lock's holders. Its key, KEYS[1], is a hash: each holder's token -> its
-- kind and when its lease ends, in the server's milliseconds ('r<ms>' for a reader,
-- 'w<ms>' for the writer); the field '=w' names the writer's token while one holds.
-- Beside it, its index, KEYS[3] (the key followed by RW_INDEX_SUFFIX), is a sorted set
-- of the same tokens scored with their ends: how many hold, the first and the last end
-- are read there in O(log N), never by reading every holder. A holding whose lease has
-- ended is dropped when met (at most RW_PURGE_MOST per script, oldest first); both keys
-- expire with the last lease, and vanish with the last holder. Readers share; the
-- writer excludes everyone. Readers and writers wait in one queue, KEYS[2], in arrival
-- order, so a reader that comes after a waiting writer waits behind it. A grant goes to
-- the first live waiter if its kind is admitted now, and on to the next while they are
-- readers and admitted.

-- unhold(token): drop a holder: its field, its end in the index, and the writer's mark
-- if it was it.
local function unhold(token)
    redis.call('HDEL', KEYS[1], token)
    redis.call('ZREM', KEYS[3], token)
    if redis.call('HGET', KEYS[1], '=w') == token then
        redis.call('HDEL', KEYS[1], '=w')
    end
end

-- scan(now): the holders now, {readers, writer's token or false, the first lease's end,
-- the last lease's end} (ends 0 without holders). Drops a few holders whose lease ended.
local function scan(now)
    if redis.call('EXISTS', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[3])  -- (the hash deleted by hand: nobody holds)
    end
    local over = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, RW_PURGE_MOST)
    for _, token in ipairs(over) do
        unhold(token)
    end
    local live = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
    local writer = redis.call('HGET', KEYS[1], '=w')
    if writer then
        local value = redis.call('HGET', KEYS[1], writer)
        if not value or tonumber(string.sub(value, 2)) <= now then
            writer = false
        end
    end
    local readers = live
    if writer then
        readers = live - 1
    end
    local first, last = 0, 0
    if live > 0 then
        local lowest = redis.call(
            'ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
        )
        first = tonumber(lowest[2])
        last = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2])
    end
    return {readers, writer, first, last}
end

-- admits(state, kind): whether a holder of `kind` ('r', 'w') may come in now.
local function admits(state, kind)
    if kind == 'w' then
        return state[1] == 0 and not state[2]
    end
    return not state[2]
end

-- keep(last): both keys live as long as the longest lease, which ends at `last`.
local function keep(last)
    local at = string.format('%d', last)
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[3], at)
end

-- hold(state, token, kind, now, ms): add a holder of `kind` with a lease of `ms` from
-- now.
local function hold(state, token, kind, now, ms)
    local ends = now + tonumber(ms)
    redis.call('HSET', KEYS[1], token, kind .. string.format('%d', ends))
    redis.call('ZADD', KEYS[3], ends, token)
    if kind == 'w' then
        redis.call('HSET', KEYS[1], '=w', token)
        state[2] = token
    else
        state[1] = state[1] + 1
    end
    if state[3] == 0 or ends < state[3] then
        state[3] = ends
    end
    if ends > state[4] then
        state[4] = ends
    end
    keep(state[4])
end

-- grant_ready(state, now, channel, sharded, me): the grant rule: grant to the first
-- live waiters while their kind is admitted (a writer ends the run). `me` (or false)
-- is the caller, which is not granted here. Returns how many it granted, and whether
-- someone is left waiting at the head (`me`, or a waiter not admitted yet).
local function grant_ready(state, now, channel, sharded, me)
    local granted = 0
    while true do
        local head = redis.call('LINDEX', KEYS[2], 0)
        if not head then
            return granted, false
        end
        if head == me then
            return granted, true
        end
        if granted > 0 and not admits(state, 'r') then
            return granted, true  -- a writer was granted: the rest wait
        end
        local entry = KEYS[2] .. ':' .. head
        local ms, kind, written, tag = read_entry(entry, false)
        if not ms then
            redis.call('LPOP', KEYS[2])  -- a dead (or unreadable) waiter's
        elseif admits(state, kind) then
            redis.call('LPOP', KEYS[2])
            redis.call('DEL', entry)
            hold(state, head, kind, now, ms)
            redis.call('PEXPIRE', KEYS[2], tonumber(ms) + QUEUE_SLACK_MS)
            tell(channel, sharded, head, ms, 0, written, tag)
            granted = granted + 1
        else
            return granted, true
        end
    end
end
