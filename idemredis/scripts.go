package idemredis

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// A record is one hash, <prefix>:{<tag>}:r, with these fields:
//
//	s, o, k  scope, operation and key as the client gave them
//	fp       fingerprint
//	st       state: pending, completed or needs_review
//	tok      fencing token
//	lu       lease deadline, Unix microseconds (data, not a TTL)
//	resp     idemstore.EncodeResponse of the stored answer
//	rsn      review reason
//	ca       created at, Unix microseconds
//	ea       expires at, Unix microseconds (also the basis of the key's TTL)
//
// Each state change is one script, run with EVALSHA (EVAL when the server
// does not know it yet), so it costs one round trip and is atomic. Every
// script touches only KEYS[1] and the record's channel, which share a hash
// tag and therefore a Cluster slot.

// Positions of the fields in fieldNames, the order in which Get, the
// listing and the reserve script read them and decodeRecord expects them.
const (
	fScope = iota
	fOperation
	fKey
	fFingerprint
	fState
	fToken
	fLeaseUntil
	fResponse
	fReason
	fCreatedAt
	fExpiresAt
	numFields
)

var fieldNames = [numFields]string{"s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea"}

// recordFields is fieldNames as Lua arguments: 's', 'o', ...
var recordFields = "'" + strings.Join(fieldNames[:], "', '") + "'"

// reserveScript creates the record only if the key is absent (SET NX
// semantics). It returns 1 when it created the record, else the existing
// record's fields.
//
// ARGV: scope, operation, key, fingerprint, token, lease_until, created_at.
var reserveScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HMGET', KEYS[1], ` + recordFields + `)
end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'o', ARGV[2], 'k', ARGV[3], 'fp', ARGV[4],
  'st', 'pending', 'tok', ARGV[5], 'lu', ARGV[6], 'ca', ARGV[7])
return 1
`)

// The fenced scripts share their first three arguments:
// ARGV[1] channel, ARGV[2] publish command (SPUBLISH or PUBLISH), ARGV[3]
// token. They return 1 when the fence held and 0 (changing nothing) when the
// record is missing, not pending, or held under another token.
const fence = `
local v = redis.call('HMGET', KEYS[1], 'st', 'tok')
if v[1] ~= 'pending' or v[2] ~= ARGV[3] then return 0 end
`

// completeScript stores the answer. ARGV[4] response, ARGV[5] expires_at,
// ARGV[6] TTL in milliseconds.
var completeScript = redis.NewScript(fence + `
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[4], 'ea', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call(ARGV[2], ARGV[1], 'completed')
return 1
`)

// releaseScript deletes a pending record.
var releaseScript = redis.NewScript(fence + `
redis.call('DEL', KEYS[1])
redis.call(ARGV[2], ARGV[1], 'released')
return 1
`)

// escalateScript marks the record needs_review. ARGV[4] reason.
var escalateScript = redis.NewScript(fence + `
redis.call('HSET', KEYS[1], 'st', 'needs_review', 'rsn', ARGV[4])
redis.call(ARGV[2], ARGV[1], 'needs_review')
return 1
`)

// extendScript moves the lease deadline. ARGV[4] lease_until.
var extendScript = redis.NewScript(fence + `
redis.call('HSET', KEYS[1], 'lu', ARGV[4])
return 1
`)

// takeoverScript gives a record whose lease has expired a new token and
// lease. ARGV[4] now, ARGV[5] new token, ARGV[6] new lease_until. A record
// already pending under the new token was taken over by an earlier run of
// the same call, whose reply was lost: that is success, not a lost lease.
var takeoverScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if ARGV[5] ~= '' and cur[1] == 'pending' and cur[2] == ARGV[5] then return 1 end
` + fence + `
local lu = tonumber(redis.call('HGET', KEYS[1], 'lu'))
if lu and lu > tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], 'tok', ARGV[5], 'lu', ARGV[6])
return 1
`)

// resolveScript settles a needs_review record. It returns 1 on success, -1
// when the record is missing and -2 when it is in another state.
// ARGV[1] channel, ARGV[2] publish command, ARGV[3] "complete" or
// "release", ARGV[4] response, ARGV[5] expires_at, ARGV[6] TTL in
// milliseconds, ARGV[7] reason (kept unless empty).
var resolveScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'st')
if not st then return -1 end
if st ~= 'needs_review' then return -2 end
if ARGV[3] == 'release' then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[2], ARGV[1], 'released')
  return 1
end
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[4], 'ea', ARGV[5])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'rsn', ARGV[7]) end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call(ARGV[2], ARGV[1], 'completed')
return 1
`)

// purgeScript deletes a completed record whose expires_at is at or before
// ARGV[1]. It returns 1 when it deleted the record.
var purgeScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'st', 'ea')
local ea = tonumber(v[2])
if v[1] == 'completed' and ea and ea <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)
