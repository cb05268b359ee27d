package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/replaygate"
)

// Reading large answers within the replay budget. A retry is known to be a
// replay only once Reserve finds the completed record, so a store that
// returned the record whole would hold every retry's answer in memory
// before any budget was asked: 400 retries of a 1 MiB answer, 400 MiB.
// When the request carries a replay gate (idem serve's max_replay_memory)
// and the store can (idemstore.ResponseReader), Reserve returns an answer
// longer than inlineResponse without it, and readReplay reads it
// only once the gate admitted it, fenced by the record's token: the
// answer the record named, or, if the record was deleted or purged
// meanwhile (and perhaps stored again for the same key), a new round of
// Begin, exactly as if the retry had come a moment later. A short answer
// comes back with its record, in one round trip, and the middleware
// charges it before it writes it.

// inlineResponse is the largest stored answer (as stored: encoded, and
// sealed) that Reserve returns with its record when the request carries a
// replay gate: about what each connection holds anyway (its buffers and
// its goroutine's stack).
const inlineResponse = 8 << 10

// readCharge is how many times its stored size a large answer is charged
// while it is read: the bytes the store's driver hands over and the
// decoded copy, before the first is dropped. sealedReadCharge is the same
// for an engine that seals: the driver's bytes, the sealed answer they
// decode to, the opened bytes, and the answer those decode to.
const (
	readCharge       = 2
	sealedReadCharge = 4
)

// errReplayBusy is Begin's error for a replay its request's gate had no
// room for (the middleware answers 503 busy).
var errReplayBusy = errors.New("idem: no room left for the replay")

// errAnswerUnread wraps the store's error when the answer of a record found
// completed could not be read. The key is known to be used, so the
// middleware answers 503 even with Config.FailOpen: running the request
// again would be a certain duplicate.
var errAnswerUnread = errors.New("idem: the stored answer of a completed key could not be read")

// inlineResponse is ReserveParams.InlineResponse for r: inlineResponse
// when its answers are read within a gate, 0 (whole) otherwise.
func (r *Request) inlineResponse() int {
	if r.replays == nil {
		return 0
	}
	return inlineResponse
}

// readReplay reads the answer Reserve left out of res.Record, once the
// request's gate admitted it. retry reports that the record no longer
// holds that answer, for Begin to reserve again. The Replayed result holds
// its share of the gate, for the middleware to give back (releaseReplay).
func (e *Engine) readReplay(ctx context.Context, req Request, res Result) (_ Result, retry bool, _ error) {
	rec := res.Record
	if req.replays == nil {
		// A store that left the answer out unasked for.
		return Result{}, false, errors.New("idem: the store left an answer out of a record unasked")
	}
	charge := int64(readCharge)
	if e.cfg.Sealer != nil {
		charge = sealedReadCharge
	}
	took, ok := replaygate.Take(req.replays, charge*rec.ResponseSize)
	if !ok {
		return Result{}, false, errReplayBusy
	}
	resp, err := idemstore.ReadResponse(ctx, e.store, rec.Key, rec.Token)
	if err != nil {
		req.replays.Release(took)
		if errors.Is(err, idemstore.ErrNotFound) {
			return Result{}, true, nil // deleted or purged since: what is there now?
		}
		return Result{}, false, fmt.Errorf("%w: %w", errAnswerUnread, err)
	}
	rec.Response, rec.ResponseSize = resp, 0
	res.Response = resp
	res.gate, res.held = req.replays, took
	return res, false, nil
}

// keepReplay gives back what res held while its answer was read and
// opened, beyond the answer itself, which the middleware holds while it
// writes it.
func (res *Result) keepReplay() {
	if res.gate == nil || res.Response == nil {
		return
	}
	keep := min(int64(len(res.Response.Body)), res.held)
	res.gate.Release(res.held - keep)
	res.held = keep
}

// releaseReplay gives back what res holds of its request's replay gate.
// It may be called more than once.
func (res *Result) releaseReplay() {
	if res.gate != nil {
		res.gate.Release(res.held)
		res.gate, res.held = nil, 0
	}
}
