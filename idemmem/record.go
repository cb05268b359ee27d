package idemmem

import (
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// record is what an entry keeps of an idemstore.Record: its strings, and
// its four times as seconds and nanoseconds (48 bytes where time.Time
// takes 96), without the fields a stored record never has (ReadAt,
// Response and Request, kept apart by the entry). A store that grows by a
// record per call pays for every byte of it, in memory and in fresh pages.
type record struct {
	Key         idemstore.Key
	Fingerprint string
	State       idemstore.State
	Token       string
	Reason      string
	ScopeLabel  string

	leaseUntilSec, createdSec, updatedSec, expiresSec     int64
	leaseUntilNsec, createdNsec, updatedNsec, expiresNsec int32
}

// stamp splits t, which the store's clock made in UTC, into what a record
// keeps: seconds since the zero time, so that a time never set (zeros) is
// the zero time; at reads it back, exactly.
func stamp(t time.Time) (sec int64, nsec int32) { return t.Unix() - zeroUnix, int32(t.Nanosecond()) }

func at(sec int64, nsec int32) time.Time { return time.Unix(sec+zeroUnix, int64(nsec)).UTC() }

// zeroUnix is the zero time in Unix seconds.
var zeroUnix = time.Time{}.Unix()

func (r *record) LeaseUntil() time.Time { return at(r.leaseUntilSec, r.leaseUntilNsec) }
func (r *record) CreatedAt() time.Time  { return at(r.createdSec, r.createdNsec) }
func (r *record) UpdatedAt() time.Time  { return at(r.updatedSec, r.updatedNsec) }
func (r *record) ExpiresAt() time.Time  { return at(r.expiresSec, r.expiresNsec) }

func (r *record) setLeaseUntil(t time.Time) { r.leaseUntilSec, r.leaseUntilNsec = stamp(t) }
func (r *record) setCreatedAt(t time.Time)  { r.createdSec, r.createdNsec = stamp(t) }
func (r *record) setUpdatedAt(t time.Time)  { r.updatedSec, r.updatedNsec = stamp(t) }
func (r *record) setExpiresAt(t time.Time)  { r.expiresSec, r.expiresNsec = stamp(t) }

// view returns r as an idemstore.Record, without ReadAt, Response and
// Request.
func (r *record) view() idemstore.Record {
	return idemstore.Record{
		Key:         r.Key,
		Fingerprint: r.Fingerprint,
		State:       r.State,
		Token:       r.Token,
		LeaseUntil:  r.LeaseUntil(),
		Reason:      r.Reason,
		ScopeLabel:  r.ScopeLabel,
		CreatedAt:   r.CreatedAt(),
		UpdatedAt:   r.UpdatedAt(),
		ExpiresAt:   r.ExpiresAt(),
	}
}
