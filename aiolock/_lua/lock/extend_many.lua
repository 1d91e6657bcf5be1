-- EXTEND_MANY: EXTEND for many holdings of one slot in one call (batched renewal).
--
-- KEYS[1...] locks: each holding's lock key
-- ARGV[1] suffix: the queue's suffix (a holding's queue is its key followed by it)
-- ARGV[2...] holdings: each holding's token and new lease (ms), in the order of KEYS
-- return one reply per holding, in order: EXTEND's 1 or 0, or -1 if its extend failed
--     with an error that says nothing of whose the key is (see lib/batch.lua).
--@include extend_lock
--@include batch

return extend_each(extend)
