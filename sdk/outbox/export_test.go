package outbox

import "time"

// SetAfterPublish sets the hook run after each row the mesh confirmed,
// before it is marked sent.
func (o *Outbox) SetAfterPublish(f func(id string) error) { o.afterPublish = f }

// SetAfterPass sets the hook told each relay pass's count.
func (o *Outbox) SetAfterPass(f func(sent int)) { o.afterPass = f }

// Lease shortens the relay's lease.
func Lease(d time.Duration) Option { return leaseOption(d) }
