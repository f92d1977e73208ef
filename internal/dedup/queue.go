package dedup

import "github.com/oklog/ulid/v2"

// entry is one id in record order with the time it was recorded.
type entry struct {
	id ulid.ULID
	at int64
}

// queue is a FIFO of entries in a ring buffer whose capacity is a power of
// two; it grows by doubling and never shrinks (compaction builds a new one).
//
// popped counts the entries ever popped, so popped+i is the absolute
// position of the i-th entry: a background compaction copies a range of
// positions in chunks while the queue moves on. filter breaks positions;
// it runs only when no background compaction does.
type queue struct {
	buf    []entry
	head   int
	n      int
	popped uint64
}

func newQueue(capacity int) queue {
	c := 1024
	for c < capacity {
		c *= 2
	}
	return queue{buf: make([]entry, c)}
}

func (q *queue) len() int { return q.n }

func (q *queue) push(e entry) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = e
	q.n++
}

// front returns the oldest entry; the queue must not be empty.
func (q *queue) front() entry { return q.buf[q.head] }

// pop removes the oldest entry; the queue must not be empty.
func (q *queue) pop() {
	q.buf[q.head] = entry{}
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	q.popped++
}

// at returns the i-th entry from the oldest; i must be below len().
func (q *queue) at(i int) entry { return q.buf[(q.head+i)&(len(q.buf)-1)] }

// each calls f for every entry, oldest first.
func (q *queue) each(f func(entry)) {
	for i := range q.n {
		f(q.buf[(q.head+i)&(len(q.buf)-1)])
	}
}

// filter keeps, in place and in order, the entries for which keep returns
// true.
func (q *queue) filter(keep func(entry) bool) {
	mask := len(q.buf) - 1
	kept := 0
	for i := range q.n {
		e := q.buf[(q.head+i)&mask]
		if keep(e) {
			q.buf[(q.head+kept)&mask] = e
			kept++
		}
	}
	for i := kept; i < q.n; i++ {
		q.buf[(q.head+i)&mask] = entry{}
	}
	q.n = kept
}

func (q *queue) grow() {
	bigger := newQueue(2 * len(q.buf))
	q.each(bigger.push)
	bigger.popped = q.popped
	*q = bigger
}
