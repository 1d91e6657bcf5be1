-- SEMAPHORE_EXTEND_MANY: SEMAPHORE_EXTEND for many permits of one slot in one call.
--
-- KEYS[1...] locks: each permit's semaphore key
-- ARGV[1] suffix: the queue's suffix (a permit's queue is its key followed by it)
-- ARGV[2...] holdings: each permit's token and new lease (ms), in the order of KEYS
-- return one reply per permit, in order: SEMAPHORE_EXTEND's 1 or 0, or -1 if its
--     extend failed with an error that says nothing of whose the key is (see
--     lib/batch.lua).
--@include extend_permit
--@include batch

return extend_each(extend)
