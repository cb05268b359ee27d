// Package groupcommit batches the state changes a SQL store receives at the
// same time into one transaction, so that N concurrent requests cost one
// commit instead of N.
//
// A store makes a [Batcher] with two functions: Single, which runs one call
// the way the store does without batching (its own autocommit statement),
// and Batch, which runs several calls in one transaction and sets each one's
// own outcome. Each Reserve, Complete, Release, Escalate or Extend becomes an
// [Op] passed to [Batcher.Do].
//
// There is no timer. A call that finds its shard idle runs alone, at once,
// in its own goroutine, through Single: a lone request pays nothing extra.
// Calls that arrive while a batch (or a lone call) runs queue up; when it
// ends, everything queued becomes the next batch, run by a goroutine that
// keeps going until the queue is empty and then exits. Under load, batches
// grow by themselves to what arrives during one transaction.
//
// What each caller gets:
//
//   - Its own outcome. Batch sorts the calls by key (same-key calls keep
//     their order), runs them one after another in one transaction, and
//     sets each Op's Record, Created and Err: two Reserves of one key in
//     one batch see what they would see one after the other.
//   - A failed batch fails every member with the batch's error, which the
//     store chooses so that it is honest about the commit: an error that
//     says nothing changed (idemstore.ErrRetryable) only when the
//     transaction surely rolled back, idemstore.ErrUnavailable otherwise.
//     No member is reported as done unless the batch committed.
//   - A batch that failed for a reason that may be one member's (a value
//     the database refuses) returns [Alone]: every member then runs alone,
//     through Single, in its own goroutine and with its own context, so
//     that one bad call does not fail the others.
//   - A caller whose context ends while its call is still queued takes it
//     out of the queue: nothing was written. One whose context ends after
//     its batch started gets the context's error and the batch goes on for
//     the others; as with any lost reply, the call may have taken effect.
//     For a Reserve the contract has the caller release the token, fenced,
//     and that release queues behind the batch on the same shard; but it is
//     bounded, and may give up while the batch waits for a lock. So the
//     batch itself releases the Reserves of callers that left, once its
//     outcome is known and before it answers the others (see left.go).
//   - A store commits what a Reserve wrote only once its statements have
//     answered, in CommitContext (see commit.go): a caller that leaves
//     while a statement waits drops the connection before any COMMIT, and
//     the server rolls back instead of committing a reservation after the
//     caller's release of its token found nothing.
//
// The batch's own context ends when the contexts of all its members have
// ended (nobody waits any more), never because one member left.
package groupcommit
