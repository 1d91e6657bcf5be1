--@include queue
-- take_entry(heir): take the entry of the queued waiter `heir` (GETDEL), read as
-- read_entry reads it; nil if it is gone (a dead waiter) or unreadable.
local function take_entry(heir)
    return read_entry(KEYS[2] .. ':' .. heir, true)
end
