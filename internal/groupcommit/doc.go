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
//     For a Reserve the contract already says what to do: release the
//     token, fenced. That release goes to the same shard as the Reserve
//     (calls are sharded by key), so it runs after the batch has committed
//     and always finds the reservation if it was made.
//
// The batch's own context ends when the contexts of all its members have
// ended (nobody waits any more), never because one member left.
package groupcommit
