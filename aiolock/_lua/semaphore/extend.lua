-- SEMAPHORE_EXTEND: a holder resets its permit's lease.
--
-- KEYS[1] lock: the semaphore's key
-- ARGV[1] token: the holder's token
-- ARGV[2] ms: the new lease in milliseconds
-- ARGV[3] queue: the queue's name (not a declared key: see EXTEND)
-- return 1 if the token still held a permit (its lease not over; the lease is reset and
--     the queue kept that long plus its slack), else 0.
--@include extend_permit

return extend(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
