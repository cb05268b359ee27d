package idemredis

import (
	"strings"

	"github.com/redis/rueidis"
)

// Each read and each state change is one script, run with EVALSHA (EVAL
// when the server does not know it yet), so it costs one round trip and is
// atomic. Every script touches only keys that share the record's hash tag,
// and therefore its Cluster slot: the record (KEYS[1]), its tombstone
// (KEYS[2], see resend.go) and its notification channel.
//
// Time belongs to the server: every script that sets or judges a deadline
// reads TIME itself, in the same atomic step that acts on it. Scripts are
// replicated by their effects (the default since Redis 5, the only mode
// since Redis 7), so reading TIME before a write is allowed. Deadlines are
// kept as Unix microseconds, which Lua's doubles hold exactly.

// recordFields is fieldNames as Lua arguments: 's', 'o', ...
var recordFields = "'" + strings.Join(fieldNames[:], "', '") + "'"

// clock starts every script that needs the time: now is the server's TIME
// in Unix microseconds, and us formats such a number for storing (tostring
// would switch to exponent notation).
const clock = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(n) return string.format('%.0f', n) end
`

// getScript reads the record together with the server's TIME, so the
// record's ReadAt comes from the clock that wrote its deadlines. It returns
// the time, then the fields in fieldNames order (all nil when the record
// does not exist).
var getScript = rueidis.NewLuaScript(clock + `
local v = redis.call('HMGET', KEYS[1], ` + recordFields + `)
table.insert(v, 1, us(now))
return v
`)

// reserveScript creates the record only if the key is absent (SET NX
// semantics), with its lease and times from the server's TIME. It returns 1
// when it created the record, else what getScript returns.
//
// ARGV: scope, operation, key, fingerprint, token, lease in microseconds,
// encoded request (empty for none).
var reserveScript = rueidis.NewLuaScript(clock + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  local v = redis.call('HMGET', KEYS[1], ` + recordFields + `)
  table.insert(v, 1, us(now))
  return v
end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'o', ARGV[2], 'k', ARGV[3], 'fp', ARGV[4],
  'st', 'pending', 'tok', ARGV[5], 'lu', us(now + tonumber(ARGV[6])), 'ca', us(now), 'ua', us(now))
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'req', ARGV[7]) end
return 1
`)

// fence starts the token-fenced scripts. They share their first five
// arguments: ARGV[1] channel, ARGV[2] publish command (SPUBLISH or
// PUBLISH), ARGV[3] token, ARGV[4] call id, ARGV[5] "1" to act only on a
// lease that expired by the server's clock. When the record is missing, not
// pending, held under another token or (with ARGV[5]) still leased, the
// script changes nothing and returns 0, or 1 if the change it was asked for
// is there already, made by an earlier run of the same call (see resend.go).
// Past the fence, the script applies its change and returns 1.
const fence = clock + `
local v = redis.call('HMGET', KEYS[1], 'st', 'tok', 'lu', 'lc')
local lu = tonumber(v[3])
if v[1] ~= 'pending' or v[2] ~= ARGV[3] or (ARGV[5] == '1' and lu and lu > now) then
  if v[4] == ARGV[4] or (not v[1] and redis.call('GET', KEYS[2]) == ARGV[4]) then return 1 end
  return 0
end
`

// completeScript stores the answer. ARGV[6] response, ARGV[7] retention in
// microseconds, ARGV[8] TTL in milliseconds.
var completeScript = rueidis.NewLuaScript(fence + `
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[6], 'ea', us(now + tonumber(ARGV[7])),
  'ua', us(now), 'lc', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call(ARGV[2], ARGV[1], 'completed')
return 1
`)

// releaseScript deletes a pending record, leaving a tombstone with the call
// id. ARGV[6] tombstone TTL in milliseconds.
var releaseScript = rueidis.NewLuaScript(fence + `
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
redis.call(ARGV[2], ARGV[1], 'released')
return 1
`)

// escalateScript marks the record needs_review. ARGV[6] reason.
var escalateScript = rueidis.NewLuaScript(fence + `
redis.call('HSET', KEYS[1], 'st', 'needs_review', 'rsn', ARGV[6], 'ua', us(now), 'lc', ARGV[4])
redis.call(ARGV[2], ARGV[1], 'needs_review')
return 1
`)

// extendScript moves the lease deadline to now + ARGV[6] microseconds. A
// resent Extend passes the fence again and renews from a later now, which
// is what the caller asked for.
var extendScript = rueidis.NewLuaScript(fence + `
redis.call('HSET', KEYS[1], 'lu', us(now + tonumber(ARGV[6])), 'ua', us(now))
return 1
`)

// takeoverScript gives a record whose lease has expired (run with ARGV[5]
// "1") a new token and lease. ARGV[6] new token, ARGV[7] lease in
// microseconds.
var takeoverScript = rueidis.NewLuaScript(fence + `
redis.call('HSET', KEYS[1], 'tok', ARGV[6], 'lu', us(now + tonumber(ARGV[7])), 'ua', us(now), 'lc', ARGV[4])
redis.call(ARGV[2], ARGV[1], 'taken_over')
return 1
`)

// resolveScript settles a needs_review record. It returns 1 on success (or
// when an earlier run of the same call settled it), -1 when the record is
// missing, -2 when it is in another state and -3 when it is in review under
// another token than ARGV[10] (when that is not empty). ARGV[1] channel,
// ARGV[2] publish command, ARGV[3] call id, ARGV[4] "complete" or
// "release", ARGV[5] response, ARGV[6] retention in microseconds, ARGV[7]
// TTL in milliseconds, ARGV[8] reason (kept unless empty), ARGV[9]
// tombstone TTL in milliseconds, ARGV[10] token.
var resolveScript = rueidis.NewLuaScript(clock + `
local v = redis.call('HMGET', KEYS[1], 'st', 'lc', 'tok')
if not v[1] then
  if redis.call('GET', KEYS[2]) == ARGV[3] then return 1 end
  return -1
end
if v[1] ~= 'needs_review' then
  if v[2] == ARGV[3] then return 1 end
  return -2
end
if ARGV[10] ~= '' and v[3] ~= ARGV[10] then return -3 end
if ARGV[4] == 'release' then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[9])
  redis.call(ARGV[2], ARGV[1], 'released')
  return 1
end
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[5], 'ea', us(now + tonumber(ARGV[6])),
  'ua', us(now), 'lc', ARGV[3])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'rsn', ARGV[8]) end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call(ARGV[2], ARGV[1], 'completed')
return 1
`)

// deleteScript deletes a completed record, leaving a tombstone. It returns
// 1 on success (or when an earlier run of the same call deleted it), -1
// when the record is missing, -2 when it is not completed and -3 when it
// was completed under another token than ARGV[5] (when that is not
// empty). ARGV[1] channel, ARGV[2] publish command, ARGV[3] call id,
// ARGV[4] tombstone TTL in milliseconds, ARGV[5] token.
var deleteScript = rueidis.NewLuaScript(`
local v = redis.call('HMGET', KEYS[1], 'st', 'tok')
if not v[1] then
  if redis.call('GET', KEYS[2]) == ARGV[3] then return 1 end
  return -1
end
if v[1] ~= 'completed' then return -2 end
if ARGV[5] ~= '' and v[2] ~= ARGV[5] then return -3 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call(ARGV[2], ARGV[1], 'deleted')
return 1
`)

// purgeScript deletes a completed record whose expires_at is at or before
// the server's TIME. It returns 1 when it deleted the record.
var purgeScript = rueidis.NewLuaScript(clock + `
local v = redis.call('HMGET', KEYS[1], 'st', 'ea')
local ea = tonumber(v[2])
if v[1] == 'completed' and ea and ea <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)
