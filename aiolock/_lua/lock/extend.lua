-- EXTEND: the holder resets its lease.
--
-- KEYS[1] lock: the lock key
-- ARGV[1] token: the holder's token
-- ARGV[2] ms: the new lease in milliseconds
-- ARGV[3] queue: the queue's name (not a declared key: see below)
-- return 1 if the key held the token (its lease is reset, and the queue, if any, kept
--     for that long plus its slack), 0 if the key is gone or belongs to someone else.
--     The extend scripts declare the lock's key alone: while a cluster migrates the
--     slot, a script whose declared keys are split between the two nodes is refused
--     (TRYAGAIN), and a renewal must go on through a migration longer than a lease.
--@include extend_lock

return extend(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
