--@include entry
-- Reading the entries of the queue KEYS[2]: the entry of token t is the key
-- KEYS[2] .. ':' .. t, and a keeper's mark KEYS[2] .. ':@' .. id.

-- read_entry(key, take): the entry at `key` (GETDEL when `take`, else GET) as
-- parse_entry reads it, less its keeper; nil if it is gone, unreadable, or kept by a
-- keeper whose mark has expired (its process stopped keeping it: a dead waiter, whose
-- entry is then deleted).
local function read_entry(key, take)
    local wants
    if take then
        wants = redis.call('GETDEL', key)
    else
        wants = redis.call('GET', key)
    end
    if not wants then
        return nil
    end
    local ms, letter, written, tag, keeper = parse_entry(wants)
    if keeper and keeper ~= '' and redis.call('EXISTS', KEYS[2] .. ':@' .. keeper) == 0 then
        if not take then
            redis.call('DEL', key)
        end
        return nil
    end
    return ms, letter, written, tag
end

