-- The format of a queue entry's value, '<ms><letter> <n> <tag> <keeper>': the first
-- lease a grant gives its waiter (ms); its letter ('f': a lock waiter that wants a
-- fence; 'r', 'w': a reader's, a writer's; '' else); the number of the attempt that
-- wrote it; the tag of its process's grant channel ('' or left out: none); the id of
-- the keeper that keeps it alive ('' or left out: its waiter's own refreshes). Python
-- writes it with aiolock._scripts.encode_entry and reads it with parse_entry there.

-- parse_entry(value): ms, letter, n, tag, keeper (strings); nil if unreadable.
local function parse_entry(value)
    return string.match(value, '^(%d+)(%a?) (%d+) ?(%w*) ?(%w*)$')
end
