-- SEMAPHORE_EXTEND_MANY: SEMAPHORE_EXTEND for many permits of one slot in one call.
--
-- KEYS[1...] locks: each permit's semaphore key
-- ARGV[1] ms: the new lease of every permit, in milliseconds
-- ARGV[2] suffix: the queue's suffix (a permit's queue is its key followed by it)
-- ARGV[3...] tokens: each permit's token, in the order of KEYS
-- return the positions (from 1) of the permits not renewed, in order, as EXTEND_MANY
--     answers; -i for a permit whose extend failed with an error that says nothing of
--     whose the key is (see lib/batch.lua).
--@include extend_permit
--@include batch

return extend_each(extend)
