--@include entry
-- queue_up(mine, token, entry, entry_ms, looks, pttl): put the caller in the queue
-- KEYS[2] (an attempt that failed), once. `token`, `entry`, `entry_ms` and `looks` are
-- an acquire script's arguments of those names (nothing is queued if `entry` is ''),
-- `mine` the entry's key, `pttl` how long the holders' leases run (a queue it makes
-- lives that long plus its slack; nil: the PTTL of KEYS[1]).
local function queue_up(mine, token, entry, entry_ms, looks, pttl)
    if entry == '' then
        return
    end
    local had = redis.call('SET', mine, entry, 'PX', entry_ms, 'GET')
    local _, _, _, _, keeper = parse_entry(entry)
    if keeper and keeper ~= '' then
        -- Kept by its client's keeper: alive while the keeper's mark is.
        redis.call('SET', KEYS[2] .. ':@' .. keeper, '1', 'PX', KEEPER_MARK_MS)
    end
    local length = 0
    -- (A call's first entry: not queued yet. Later: queued unless the list lost it.)
    local queued = had
    if looks == '1' then
        queued = redis.call('LPOS', KEYS[2], token)
    end
    if not queued then
        length = redis.call('RPUSH', KEYS[2], token)
    end
    if length == 1 or looks == '1' then
        local life = pttl
        if life == nil then
            life = redis.call('PTTL', KEYS[1])
        end
        if life < 0 then
            life = 0
        end
        redis.call('PEXPIRE', KEYS[2], life + QUEUE_SLACK_MS)
    end
end
