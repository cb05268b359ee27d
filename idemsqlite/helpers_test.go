package idemsqlite_test

import (
	"context"
	"errors"
)

func errorsIsCanceled(err error) bool { return errors.Is(err, context.Canceled) }
