package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/storeurl"
)

// keyService is what the key commands need: the admin API of a running
// proxy (idemadmin.Client) or a store opened directly (storeKeys).
type keyService interface {
	List(ctx context.Context, q idemadmin.ListQuery) (idemadmin.Page, error)
	Get(ctx context.Context, id string) (idemadmin.Item, error)
	Resolve(ctx context.Context, id string, req idemadmin.ResolveRequest) (idemadmin.Result, error)
	Delete(ctx context.Context, id string, req idemadmin.DeleteRequest) (idemadmin.Result, error)
	Counts(ctx context.Context) (idemadmin.Counts, error)
}

// storeKeys is keyService on a store opened directly; changes are made in
// the name of the operating-system user.
type storeKeys struct {
	keys *idemadmin.Keys
	who  string
}

func (s storeKeys) List(ctx context.Context, q idemadmin.ListQuery) (idemadmin.Page, error) {
	return s.keys.List(ctx, q)
}

func (s storeKeys) Get(ctx context.Context, id string) (idemadmin.Item, error) {
	return s.keys.Get(ctx, id)
}

func (s storeKeys) Resolve(ctx context.Context, id string, req idemadmin.ResolveRequest) (idemadmin.Result, error) {
	return s.keys.Resolve(ctx, id, s.who, req)
}

func (s storeKeys) Counts(ctx context.Context) (idemadmin.Counts, error) {
	return s.keys.Counts(ctx)
}

func (s storeKeys) Delete(ctx context.Context, id string, req idemadmin.DeleteRequest) (idemadmin.Result, error) {
	return s.keys.Delete(ctx, id, s.who, req)
}

// keySource is where the key commands find keys: --admin-url (the admin
// API of a running idem serve) or --store (the store itself).
type keySource struct {
	adminURL, tokenFile, store, encryptionKeyFile string
}

func (s *keySource) flags(fl *pflag.FlagSet) {
	fl.StringVar(&s.adminURL, "admin-url", "", "the admin listener of a running idem serve, e.g. http://127.0.0.1:9090 (or IDEM_ADMIN_URL)")
	fl.StringVar(&s.tokenFile, "admin-token-file", "", "file holding the admin token for --admin-url (or IDEM_ADMIN_TOKEN)")
	fl.StringVar(&s.store, "store", "", "open this store directly instead: sqlite://PATH (which must exist), postgres://…, mysql://…, redis://…")
	fl.StringVar(&s.encryptionKeyFile, "encryption-key-file", "", "with --store: the keys idem serve seals answers with, to open them and seal the answers stored here (or IDEM_ENCRYPTION_KEY)")
}

// open returns the key service the flags name. It never creates a store:
// a SQLite file that does not exist is an error, and so is memory://.
func (s *keySource) open(cmd *cobra.Command) (keyService, func() error, error) {
	adminURL := s.adminURL
	if adminURL == "" && s.store == "" {
		adminURL = os.Getenv("IDEM_ADMIN_URL")
	}
	switch {
	case adminURL != "" && s.store != "":
		return nil, nil, usageError{errors.New("give --admin-url or --store, not both")}
	case adminURL != "":
		tok, err := s.token()
		if err != nil {
			return nil, nil, usageError{err}
		}
		c, err := idemadmin.NewClient(adminURL, tok, nil)
		if err != nil {
			return nil, nil, usageError{err}
		}
		return c, func() error { return nil }, nil
	case s.store != "":
		t, err := storeurl.Parse(s.store)
		if err != nil {
			return nil, nil, usageError{err}
		}
		if err := t.CheckExisting(); err != nil {
			return nil, nil, err
		}
		sealer, err := s.sealer()
		if err != nil {
			return nil, nil, usageError{err}
		}
		st, closeFn, err := t.Connect(cmd.Context(), false)
		if err != nil {
			return nil, nil, err
		}
		log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
		keys := &idemadmin.Keys{Store: st, Logger: log}
		if sealer != nil {
			keys.Sealer = sealer
		}
		return storeKeys{keys: keys, who: osUser()}, closeFn, nil
	}
	return nil, nil, usageError{errors.New("say where the keys are: --admin-url URL (the --admin listener of a running idem serve, with its token) or --store URL (the store itself)")}
}

// sealer reads the keyring of --encryption-key-file or IDEM_ENCRYPTION_KEY,
// as idem serve does, so that a store opened directly shows the answers
// the proxy sealed and seals the answers an operator stores in it; nil
// when neither is set.
func (s *keySource) sealer() (*idemseal.Keyring, error) {
	env := os.Getenv("IDEM_ENCRYPTION_KEY")
	switch {
	case s.encryptionKeyFile != "" && env != "":
		return nil, errors.New("both IDEM_ENCRYPTION_KEY and --encryption-key-file are set; keep one")
	case s.encryptionKeyFile != "":
		return idemseal.LoadKeyFile(s.encryptionKeyFile)
	case env != "":
		k, err := idemseal.ParseKeys(env)
		if err != nil {
			return nil, fmt.Errorf("IDEM_ENCRYPTION_KEY: %w", err)
		}
		return k, nil
	}
	return nil, nil
}

// token reads the admin token from --admin-token-file or IDEM_ADMIN_TOKEN:
// the token, or a whole NAME:TOKEN line of the proxy's token file, which
// the API reads as the proxy reads its file (idemadmin.Credential).
func (s *keySource) token() (string, error) {
	switch {
	case s.tokenFile != "":
		b, err := os.ReadFile(s.tokenFile)
		if err != nil {
			return "", fmt.Errorf("admin token file: %w", err)
		}
		tok, err := idemadmin.Credential(string(b))
		if err != nil {
			return "", fmt.Errorf("admin token file %s: %w (give the command a file with the one token to use)", s.tokenFile, err)
		}
		return tok, nil
	case os.Getenv("IDEM_ADMIN_TOKEN") != "":
		tok, err := idemadmin.Credential(os.Getenv("IDEM_ADMIN_TOKEN"))
		if err != nil {
			return "", fmt.Errorf("IDEM_ADMIN_TOKEN: %w", err)
		}
		return tok, nil
	}
	return "", errors.New("--admin-url needs the admin token: --admin-token-file PATH or IDEM_ADMIN_TOKEN")
}

// osUser names who makes a change on a store opened directly.
func osUser() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	name = strings.Map(func(r rune) rune {
		if r < '!' || r > '~' {
			return '_'
		}
		return r
	}, name)
	if name == "" {
		name = "unknown"
	}
	return "cli:" + name
}

// keyFlags select one key: its ID (an argument, or --id) or its three parts.
type keyFlags struct {
	id, scope, operation, key string
}

func (k *keyFlags) flags(fl *pflag.FlagSet) {
	fl.StringVar(&k.id, "id", "", "the key's id or short id, as listings show them")
	fl.StringVar(&k.scope, "scope", "", "the key's scope (with --operation and --key, instead of an id)")
	fl.StringVar(&k.operation, "operation", "", "the key's operation, e.g. 'POST /payments'")
	fl.StringVar(&k.key, "key", "", "the Idempotency-Key")
}

// resolveID returns the ID the flags and args name.
func (k *keyFlags) resolveID(args []string) (string, error) {
	id := k.id
	if len(args) == 1 {
		if id != "" && id != args[0] {
			return "", usageError{errors.New("give the id once: as an argument or with --id")}
		}
		id = args[0]
	}
	parts := k.scope != "" || k.operation != "" || k.key != ""
	switch {
	case id != "" && parts:
		return "", usageError{errors.New("give an id or --scope, --operation and --key, not both")}
	case id != "":
		if idemadmin.IsShortID(id) {
			return id, nil // the store finds it by its key
		}
		if _, err := idemadmin.ParseKeyID(id); err != nil {
			return "", usageError{err}
		}
		return id, nil
	case k.scope == "" || k.operation == "" || k.key == "":
		return "", usageError{errors.New("name the key: its id or short id (from a listing), or --scope, --operation and --key")}
	}
	return idemadmin.KeyID(idemstore.Key{Scope: k.scope, Operation: k.operation, Key: k.key}), nil
}
