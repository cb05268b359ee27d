package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Main runs the idem command line with args (without the program name) and
// returns the process exit code. SIGINT and SIGTERM cancel the command's
// context, which long-running commands treat as a request to shut down.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(stderr, "idem:", err)
			fmt.Fprintln(stderr, "Run 'idem help' for usage.")
			return 2
		}
		fmt.Fprintln(stderr, "idem:", err)
		return 1
	}
	return 0
}

// usageError marks an error in the command line itself (exit code 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// NewRoot returns the root command with every subcommand attached.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Make any HTTP API safe to retry with Idempotency-Key",
		Long: `idem makes non-idempotent operations (create, charge, send) safe to retry.
A client sends an Idempotency-Key header; idem runs the operation at most once
per key and replays the first answer to every retry.

Start with the demo, which runs the proxy in front of a built-in payments API
and shows every behaviour in one go:

  idem demo

Then put the proxy in front of your own API:

  idem serve --upstream http://127.0.0.1:3000`,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newVersionCmd())
	for _, add := range extraCommands {
		root.AddCommand(add())
	}
	return root
}

// extraCommands are registered by the files that define them.
var extraCommands []func() *cobra.Command
