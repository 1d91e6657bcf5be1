-- RW_EXTEND: a reader or the writer resets its holding's lease.
--
-- KEYS[1] lock: the read-write lock's key
-- ARGV[1] token: the holder's token
-- ARGV[2] ms: the new lease in milliseconds
-- ARGV[3] queue: the queue's name (not a declared key: see EXTEND)
-- return 1 if the token still held (its lease not over; the lease is reset in the hash
--     and in the index, and the queue kept that long plus its slack), else 0.
--@include extend_rw

return extend(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
