package cli

import (
	"fmt"
	"os"
	"strings"
)

// storeFileEnv names a file holding the store URL, for deployments that
// mount secrets as files (a Kubernetes Secret, systemd's LoadCredential=):
// a PostgreSQL, MySQL or Redis URL carries a password, which belongs
// neither in the config file nor on the command line.
const storeFileEnv = "IDEM_STORE_FILE"

// storeFromFile sets *store (Config.Store) from the file $IDEM_STORE_FILE names, when
// it is set: its first line, surrounding spaces trimmed. It takes the place
// of --store and the config file's store, so that a secret and a flag never
// both claim it silently: both set is an error.
func storeFromFile(store *string, flagSet bool) error {
	path := os.Getenv(storeFileEnv)
	if path == "" {
		return nil
	}
	if flagSet {
		return fmt.Errorf("both --store and %s are set; keep one", storeFileEnv)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", storeFileEnv, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return fmt.Errorf("%s: %s holds no store URL", storeFileEnv, path)
	}
	*store = line
	return nil
}
