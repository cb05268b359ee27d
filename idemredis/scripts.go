package idemredis

import (
	"strings"

	"github.com/redis/rueidis"
)

// Each read and each state change is one script, run with EVALSHA (EVAL
// when the server does not know it yet), so it costs one round trip and is
// atomic. Every script touches only keys that share the record's hash tag,
// and therefore its Cluster slot: the record (KEYS[1]), its tombstone
// (KEYS[2], see resend.go) and its notification channel, whose name is the
// record's with n for r.
//
// Time belongs to the server: every script that sets or judges a deadline
// reads TIME itself, in the same atomic step that acts on it. Scripts are
// replicated by their effects (the default since Redis 5, the only mode
// since Redis 7), so reading TIME before a write is allowed. Deadlines are
// kept as Unix microseconds, which Lua's doubles hold exactly.
//
// What a script costs the server is mostly the script call itself (its
// KEYS and ARGV become a Lua table each), its commands (each converts its
// arguments and its reply between Lua and Redis) and the strings it makes:
// Lua hashes every byte of each string it creates, arguments and replies
// included (about 11 instructions a byte, some 25µs for a 16 KiB answer).
// So a request's two scripts issue few commands (Reserve: TIME and SET NX;
// Complete: TIME, GETRANGE and SET, and SPUBLISH only while someone waits
// for the record, see notify.go), take few arguments, and never make a
// large answer or stored request into a Lua string twice: past smallValue
// bytes, Reserve writes the record's tail and then its head with SETRANGE
// into the missing key, and Complete builds the record with the answer
// with SETRANGE and BITOP in a scratch key (see completeScript). Neither
// appends to a record: Redis grows a string it appends to to twice its new
// length, and the record would keep that memory until it expires.

// smallValue is the size up to which the scripts concatenate a value into
// a record in Lua (a second copy, hashed again) rather than spend commands
// (SETRANGE, BITOP, RENAME, PEXPIRE) on it.
const smallValue = "512"

// inlinePrefix is how many bytes of a record readInline reads at once
// (see record): enough for the head, key, fingerprint and a small request
// and answer of most records, small enough that a large answer is not
// read to be left out.
const inlinePrefix = "4096"

// clock starts every script that needs the time: now is the server's TIME
// in Unix microseconds, and us formats such a number for a reply
// (tostring would switch to exponent notation).
const clock = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(n) return string.format('%.0f', n) end
`

// record defines what the scripts share to read and write a record (see
// record.go for the layout):
//
//   - read(n) returns the first n bytes of the record at KEYS[1] (the whole
//     record when n is nil or the record is shorter), empty when there is
//     none. A record of an earlier version, a hash, is turned into the
//     string layout in memory and kept in old.
//   - head(v) decodes the fixed part of a record and the length of its
//     token: state, flags, lease, created, expires, updated, call id, token
//     length. It keeps the record's layout in lay (1, or 2 for a record
//     with a scope label).
//   - fixed(...) encodes the fixed part (the first 51 bytes) in layout lay.
//   - token(v, tl) is the token of a record whose token is tl bytes long.
//   - upgrade() writes a record read from a hash back in the string
//     layout, keeping its TTL; a script that changes a record calls it
//     before its first write.
//   - reasonAt(v) is the position of the review reason's length.
//   - answerAt(v) is the position of the stored answer's first byte, for a
//     record whose head v holds (head called on it); the lengths that v,
//     a prefix of the record, does not hold are read with GETRANGE, so
//     that neither a large request nor a large answer is read to find it.
//   - readInline(limit) is read(), but with limit positive an answer
//     longer than limit bytes is left out: it returns the record up to its
//     answer and the answer's size second (0 when the answer is whole).
//     The record's first inlinePrefix bytes are read at once, the rest
//     only as needed (STRLEN for the size, GET for a kept answer past the
//     prefix). A hash is read with legacy(key, limit), and not kept in
//     old: a record read without its answer is never written back.
//   - unindex(km, am) removes the record from the indexes KEYS[3] (key),
//     KEYS[4] (by age) and KEYS[5] (in review), given its key member km
//     and age member am (see index.go).
//   - SHIFT is pendingShift: a pending record's score in the set by age is
//     its created-at less SHIFT (see index.go).
//   - publish(event) publishes event on the record's channel; notify(fl,
//     event) does so when the flags fl say that someone waits.
//
// PUB is replaced by the publish command (see newScripts).
const record = legacyLua + `
local old
local lay = 1
local function read(n)
  local v
  if n then v = redis.pcall('GETRANGE', KEYS[1], 0, n - 1) else v = redis.pcall('GET', KEYS[1]) end
  if type(v) == 'string' then return v end
  if not v then return '' end
  if not string.find(v.err or '', 'WRONGTYPE', 1, true) then error(v) end
  old = legacy(KEYS[1])
  if n then return string.sub(old, 1, n) end
  return old
end
local function head(v)
  local layout, st, fl, lu, ca, ea, ua, lc, tl = struct.unpack('>Bc1Bi8i8i8i8c16I4', v)
  if layout ~= 1 and layout ~= 2 then error('idemredis: record of unknown layout ' .. layout) end
  lay = layout
  return st, fl, lu, ca, ea, ua, lc, tl
end
local function fixed(st, fl, lu, ca, ea, ua, lc)
  return struct.pack('>Bc1Bi8i8i8i8c16', lay, st, fl, lu, ca, ea, ua, lc)
end
local function token(v, tl) return string.sub(v, 56, 55 + tl) end
local function upgrade()
  if not old then return end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('SET', KEYS[1], old, 'PX', ttl) else redis.call('SET', KEYS[1], old) end
  old = nil
end
local function reasonAt(v)
  local p = 52
  for _ = 1, 5 + lay do p = p + 4 + struct.unpack('>I4', v, p) end
  return p
end
local function lenAt(v, p)
  if p + 3 <= #v then return (struct.unpack('>I4', v, p)) end
  return (struct.unpack('>I4', redis.call('GETRANGE', KEYS[1], p - 1, p + 2)))
end
local function answerAt(v)
  local p = 52
  for _ = 1, 6 + lay do p = p + 4 + lenAt(v, p) end
  return p
end
local function readInline(limit)
  if not limit or limit <= 0 then return read(), 0 end
  local v = redis.pcall('GETRANGE', KEYS[1], 0, ` + inlinePrefix + ` - 1)
  if type(v) ~= 'string' then
    if not string.find(v.err or '', 'WRONGTYPE', 1, true) then error(v) end
    return legacy(KEYS[1], limit)
  end
  if v == '' then return '', 0 end
  head(v)
  local a = answerAt(v)
  local total = #v
  if total >= ` + inlinePrefix + ` then total = redis.call('STRLEN', KEYS[1]) end
  local size = total - a + 1
  if size <= limit then
    if total == #v then return v, 0 end
    return redis.call('GET', KEYS[1]), 0
  end
  if a - 1 <= #v then return string.sub(v, 1, a - 1), size end
  return redis.call('GETRANGE', KEYS[1], 0, a - 2), size
end
local function unindex(km, am)
  redis.call('ZREM', KEYS[3], km)
  redis.call('ZREM', KEYS[4], am)
  redis.call('ZREM', KEYS[5], am)
end
local SHIFT = ` + pendingShift + `
local function publish(event) redis.call('PUB', string.sub(KEYS[1], 1, -2) .. 'n', event) end
local function notify(fl, event) if fl % 2 == 1 then publish(event) end end
`

// scripts are the store's scripts for one publish command.
type scripts struct {
	get, reserve, watch, response                 *rueidis.Lua
	complete, release, escalate, extend, takeover *rueidis.Lua
	resolve, delete, purge                        *rueidis.Lua
	fix, index                                    *rueidis.Lua
}

var (
	shardedScripts = newScripts("SPUBLISH")
	classicScripts = newScripts("PUBLISH")
)

// scripts returns the scripts for the store's publish command.
func (s *Store) scripts() *scripts {
	if s.cfg.ClassicPubSub {
		return classicScripts
	}
	return shardedScripts
}

// newScripts makes the scripts that publish with pub.
func newScripts(pub string) *scripts {
	lua := func(body string) *rueidis.Lua {
		return rueidis.NewLuaScript(strings.ReplaceAll(body, "'PUB'", "'"+pub+"'"))
	}
	return &scripts{
		get:      lua(getScript),
		reserve:  lua(reserveScript),
		watch:    lua(watchScript),
		response: lua(responseScript),
		complete: lua(completeScript),
		release:  lua(releaseScript),
		escalate: lua(escalateScript),
		extend:   lua(extendScript),
		takeover: lua(takeoverScript),
		resolve:  lua(resolveScript),
		delete:   lua(deleteScript),
		purge:    lua(purgeScript),
		fix:      lua(fixScript),
		index:    lua(indexScript),
	}
}

// getScript reads the record together with the server's TIME, so the
// record's ReadAt comes from the clock that wrote its deadlines. It returns
// the time, the record (empty when there is none) and the size of an
// answer left out of it (0 when none was). ARGV[1], optional, is the
// limit of readInline (GetHead); without it the record is read whole.
const getScript = clock + record + `
local v, size = readInline(tonumber(ARGV[1] or '0'))
return {us(now), v, size}
`

// responseScript returns the answer stored in the record while it is
// completed under the token ARGV[1], and an empty string otherwise
// (ReadResponse). It reads the record's head and the lengths before the
// answer, and then only the answer (GETRANGE to the end). A record past its
// expires-at is still read while its key lasts (Config.RetentionGrace), as
// Reserve and Get still return it.
const responseScript = record + `
local n = math.max(` + inlinePrefix + `, 55 + #ARGV[1])
local v = redis.pcall('GETRANGE', KEYS[1], 0, n - 1)
if type(v) ~= 'string' then
  if not string.find(v.err or '', 'WRONGTYPE', 1, true) then error(v) end
  local h = redis.call('HMGET', KEYS[1], 'st', 'tok')
  if h[1] ~= 'completed' or h[2] ~= ARGV[1] then return '' end
  return redis.call('HGET', KEYS[1], 'resp') or ''
end
if v == '' then return '' end
local st, fl, lu, ca, ea, ua, lc, tl = head(v)
if st ~= 'c' or tl ~= #ARGV[1] or token(v, tl) ~= ARGV[1] then return '' end
local a = answerAt(v)
if #v < n then return string.sub(v, a) end
return redis.call('GETRANGE', KEYS[1], a - 1, -1)
`

// reserveScript creates the record only if the key is absent (SET NX), with
// its lease and times from the server's TIME. It returns 1 when it created
// the record, else what getScript returns. A full server (OOM under
// noeviction) refuses the SET even when the key exists, so the script then
// reads the record and returns it, and returns the refusal only when there
// is none: a completed key still replays on a full server. A tail longer
// than smallValue is not concatenated: the script checks that the key is
// missing (EXISTS), writes the tail at offset 35 of the missing key, which
// makes a string of exactly the record's size, and then the head.
//
// A record it creates joins the key index, the set by age (as pending:
// its created-at less SHIFT) and, with a label, the label index (see
// index.go): two or three ZADD.
//
// KEYS: the record, the key index, the set by age, the label index (only
// with a label). ARGV: lease in
// microseconds, the record after its first 35 bytes (pendingTail: call
// id, token, key, fingerprint, request, label with one, reason), the key
// member, the age member, and, only for a record with a scope label, its
// label member; a record with a label is in layout 2.
//
// ARGV[5] is the limit of readInline for the record it returns
// (ReserveParams.InlineResponse, 0 for none), and the label member, with a
// label, is ARGV[6]. The reply that returns a record has a third element,
// the size of an answer left out of it (0 when none was).
const reserveScript = clock + record + `
local layout = 1
if ARGV[6] then layout = 2 end
local limit = tonumber(ARGV[5])
local h = struct.pack('>Bc1Bi8i8i8i8', layout, 'p', 0, now + tonumber(ARGV[1]), now, 0, now)
local function index()
  redis.call('ZADD', KEYS[2], 0, ARGV[3])
  redis.call('ZADD', KEYS[3], now - SHIFT, ARGV[4])
  if ARGV[6] then redis.call('ZADD', KEYS[4], 0, ARGV[6]) end
end
if #ARGV[2] > ` + smallValue + ` then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local v, size = readInline(limit)
    return {us(now), v, size}
  end
  redis.call('SETRANGE', KEYS[1], #h, ARGV[2])
  redis.call('SETRANGE', KEYS[1], 0, h)
  index()
  return 1
end
local created = redis.pcall('SET', KEYS[1], h .. ARGV[2], 'NX')
if not created then
  local v, size = readInline(limit)
  return {us(now), v, size}
end
if created.err then
  local v, size = readInline(limit)
  if v == '' then return created end
  return {us(now), v, size}
end
index()
return 1
`

// watchScript marks a pending record as waited for, so that the scripts
// that change it publish on its channel (see notify.go). It returns 1 when
// the record is pending (and now marked), 0 when it is missing or in
// another state. A hash written by the previous version is marked with a
// field, not rewritten: its holder may be a process of that version (see
// legacy.go).
const watchScript = record + `
local v = read(55)
if v == '' then return 0 end
local st, fl = head(v)
if st ~= 'p' then return 0 end
if old then
  redis.call('HSET', KEYS[1], 'w', '1')
elseif fl % 2 == 0 then
  redis.call('SETRANGE', KEYS[1], 2, struct.pack('B', fl + 1))
end
return 1
`

// fence starts the token-fenced scripts. They share their first three
// arguments: ARGV[1] token, ARGV[2] call id, ARGV[3] "1" to act only on a
// lease that expired by the server's clock. When the record is missing, not
// pending, held under another token or (with ARGV[3]) still leased, the
// script changes nothing and returns 0, or 1 if the change it was asked for
// is there already, made by an earlier run of the same call (see resend.go).
// Past the fence, the script applies its change and returns 1.
//
// It reads the record's first n bytes, which hold its head and token when
// the token is the caller's: v is the whole record when #v < n.
const fence = clock + record + `
local n = math.max(` + smallValue + `, 55 + #ARGV[1])
local v = read(n)
if v == '' then
  if redis.call('GET', KEYS[2]) == ARGV[2] then return 1 end
  return 0
end
local st, fl, lu, ca, ea, ua, lc, tl = head(v)
if st ~= 'p' or tl ~= #ARGV[1] or token(v, tl) ~= ARGV[1] or (ARGV[3] == '1' and lu > now) then
  if lc == ARGV[2] then return 1 end
  return 0
end
`

// completeScript stores the answer. ARGV[4] response (never empty),
// ARGV[5] retention in microseconds, ARGV[6] TTL in milliseconds, ARGV[7]
// the age member, whose score in the set by age KEYS[4] becomes the
// created-at (one ZADD, XX: a record that no index holds yet stays out
// until Reindex). A pending record has no answer yet, so the answer goes
// at its end.
//
// A small record with a small answer is concatenated in Lua. A larger one
// is built in the scratch key KEYS[3] without making the answer or the
// stored request a Lua string again: SETRANGE past the end of a missing
// key creates a string of exactly that size (zeros, then the answer),
// BITOP OR copies the record over the zeros, SETRANGE writes the new head,
// and RENAME puts the result in the record's place. APPEND to the record
// would be one command, but Redis grows a string it appends to to twice
// its new length, which the record would then occupy until it expires.
// The first SETRANGE is the script's first write but for upgrade(), so a
// full server (OOM under noeviction) refuses it before anything changed.
const completeScript = fence + `
upgrade()
local h = fixed('c', 0, lu, ca, now + tonumber(ARGV[5]), now, ARGV[2])
if #v < n and #ARGV[4] <= ` + smallValue + ` then
  redis.call('SET', KEYS[1], h .. string.sub(v, 52) .. ARGV[4], 'PX', ARGV[6])
else
  local len = #v
  if len >= n then len = redis.call('STRLEN', KEYS[1]) end
  redis.call('SETRANGE', KEYS[3], len, ARGV[4])
  redis.call('BITOP', 'OR', KEYS[3], KEYS[3], KEYS[1])
  redis.call('SETRANGE', KEYS[3], 0, h)
  redis.call('RENAME', KEYS[3], KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
end
redis.call('ZADD', KEYS[4], 'XX', ca, ARGV[7])
notify(fl, 'completed')
return 1
`

// releaseScript deletes a pending record, leaving a tombstone with the call
// id, and takes it out of the indexes (see unindex; its label index entry
// goes at the next Purge). ARGV[4] tombstone TTL in milliseconds, ARGV[5]
// key member, ARGV[6] age member; KEYS[3] to KEYS[5] the indexes.
const releaseScript = fence + `
unindex(ARGV[5], ARGV[6])
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
notify(fl, 'released')
return 1
`

// escalateScript marks the record needs_review with the reason ARGV[4],
// adding its age member ARGV[5] to the review set KEYS[4] and giving it
// its created-at as score in the set by age KEYS[3]. Its first write is a
// ZADD, which a full server (OOM under noeviction) refuses before
// anything changed.
const escalateScript = fence + `
upgrade()
redis.call('ZADD', KEYS[4], ca, ARGV[5])
redis.call('ZADD', KEYS[3], 'XX', ca, ARGV[5])
local w = read()
local q = reasonAt(w)
local rest = string.sub(w, q + 4 + struct.unpack('>I4', w, q))
redis.call('SET', KEYS[1], fixed('r', 0, lu, ca, ea, now, ARGV[2]) .. string.sub(w, 52, q - 1) ..
  struct.pack('>I4', #ARGV[4]) .. ARGV[4] .. rest)
notify(fl, 'needs_review')
return 1
`

// extendScript moves the lease deadline to now + ARGV[4] microseconds. A
// resent Extend passes the fence again and renews from a later now, which
// is what the caller asked for.
const extendScript = fence + `
upgrade()
redis.call('SETRANGE', KEYS[1], 0, fixed('p', fl, now + tonumber(ARGV[4]), ca, ea, now, lc))
return 1
`

// takeoverScript gives a record whose lease has expired (run with ARGV[3]
// "1") a new token and lease. ARGV[4] new token, ARGV[5] lease in
// microseconds. Waiters stay marked: they wait for the new holder too.
const takeoverScript = fence + `
upgrade()
local w = read()
redis.call('SET', KEYS[1], fixed('p', fl, now + tonumber(ARGV[5]), ca, ea, now, ARGV[2]) ..
  struct.pack('>I4', #ARGV[4]) .. ARGV[4] .. string.sub(w, 56 + tl))
notify(fl, 'taken_over')
return 1
`

// resolveScript settles a needs_review record. It returns 1 on success (or
// when an earlier run of the same call settled it), -1 when the record is
// missing, -2 when it is in another state and -3 when it is in review under
// another token than ARGV[8] (when that is not empty). ARGV[1] call id,
// ARGV[2] "complete" or "release", ARGV[3] response, ARGV[4] retention in
// microseconds, ARGV[5] TTL in milliseconds, ARGV[6] reason (kept unless
// empty), ARGV[7] tombstone TTL in milliseconds, ARGV[8] token, ARGV[9]
// key member, ARGV[10] age member; KEYS[3] to KEYS[5] the indexes (see
// unindex). It always publishes.
const resolveScript = clock + record + `
local w = read()
if w == '' then
  if redis.call('GET', KEYS[2]) == ARGV[1] then return 1 end
  return -1
end
local st, fl, lu, ca, ea, ua, lc, tl = head(w)
if st ~= 'r' then
  if lc == ARGV[1] then return 1 end
  return -2
end
if ARGV[8] ~= '' and token(w, tl) ~= ARGV[8] then return -3 end
if ARGV[2] == 'release' then
  unindex(ARGV[9], ARGV[10])
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[7])
  publish('released')
  return 1
end
local q = reasonAt(w)
local rsn = ARGV[6]
if rsn == '' then rsn = string.sub(w, q + 4, q + 3 + struct.unpack('>I4', w, q)) end
redis.call('SET', KEYS[1], fixed('c', 0, lu, ca, now + tonumber(ARGV[4]), now, ARGV[1]) .. string.sub(w, 52, q - 1) ..
  struct.pack('>I4', #rsn) .. rsn .. ARGV[3], 'PX', ARGV[5])
redis.call('ZREM', KEYS[5], ARGV[10])
publish('completed')
return 1
`

// deleteScript deletes a completed record, leaving a tombstone. It returns
// 1 on success (or when an earlier run of the same call deleted it), -1
// when the record is missing, -2 when it is not completed and -3 when it
// was completed under another token than ARGV[3] (when that is not
// empty). ARGV[1] call id, ARGV[2] tombstone TTL in milliseconds, ARGV[3]
// token, ARGV[4] key member, ARGV[5] age member; KEYS[3] to KEYS[5] the
// indexes (see unindex). It always publishes.
const deleteScript = record + `
local v = read(math.max(` + smallValue + `, 55 + #ARGV[3]))
if v == '' then
  if redis.call('GET', KEYS[2]) == ARGV[1] then return 1 end
  return -1
end
local st, fl, lu, ca, ea, ua, lc, tl = head(v)
if st ~= 'c' then return -2 end
if ARGV[3] ~= '' and (tl ~= #ARGV[3] or token(v, tl) ~= ARGV[3]) then return -3 end
unindex(ARGV[4], ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
publish('deleted')
return 1
`

// purgeScript deletes a completed record whose expires_at is at or before
// the server's TIME, reading only the record's head. It returns 1 when it
// deleted the record.
const purgeScript = clock + record + `
local v = read(55)
if v == '' then return 0 end
local st, fl, lu, ca, ea = head(v)
if st == 'c' and ea ~= 0 and ea <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`

// fixScript drops the index entries of a record that is gone (its TTL ran
// out, or Purge deleted it), takes a record that is no longer in review
// out of the review set and gives it the score its state calls for in the
// set by age, so that the indexes never keep what the record does not
// say (a process of an earlier version changes records without them). It
// returns 1 when the record is gone. KEYS: the record, its tombstone
// (unused), the indexes (see unindex), the label index; ARGV: key member,
// age member, label member or "".
const fixScript = record + `
local v = read(55)
if v == '' then
  unindex(ARGV[1], ARGV[2])
  if ARGV[3] ~= '' then redis.call('ZREM', KEYS[6], ARGV[3]) end
  return 1
end
local st, fl, lu, ca = head(v)
if st ~= 'r' then redis.call('ZREM', KEYS[5], ARGV[2]) end
local sc = redis.call('ZSCORE', KEYS[4], ARGV[2])
if sc then
  local want = ca
  if st == 'p' then want = ca - SHIFT end
  if tonumber(sc) ~= want then redis.call('ZADD', KEYS[4], want, ARGV[2]) end
end
return 0
`

// indexScript puts a record that exists into the indexes its state and
// creation time call for (Reindex: records written before the indexes
// were). KEYS and ARGV as fixScript's. It returns 1 when the record
// exists.
const indexScript = record + `
local v = read(55)
if v == '' then return 0 end
local st, fl, lu, ca = head(v)
redis.call('ZADD', KEYS[3], 0, ARGV[1])
if st == 'p' then redis.call('ZADD', KEYS[4], ca - SHIFT, ARGV[2]) else redis.call('ZADD', KEYS[4], ca, ARGV[2]) end
if st == 'r' then redis.call('ZADD', KEYS[5], ca, ARGV[2]) else redis.call('ZREM', KEYS[5], ARGV[2]) end
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[6], 0, ARGV[3]) end
return 1
`
