-- RW_EXTEND_MANY: RW_EXTEND for many holdings of one slot in one call.
--
-- KEYS[1...] locks: each holding's read-write lock key
-- ARGV[1] ms: the new lease of every holding, in milliseconds
-- ARGV[2] suffix: the queue's suffix (a holding's queue is its key followed by it)
-- ARGV[3...] tokens: each holding's token, in the order of KEYS
-- return the positions (from 1) of the holdings not renewed, in order, as EXTEND_MANY
--     answers; -i for a holding whose extend failed with an error that says nothing of
--     whose the key is (see lib/batch.lua).
--@include extend_rw
--@include batch

return extend_each(extend)
