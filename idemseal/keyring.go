package idemseal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/idem-dev/idem/idemstore"
)

// KeySize is the length of a secret: AES-256 takes 32 bytes.
const KeySize = 32

// MaxIDLength bounds a key ID, in bytes.
const MaxIDLength = 64

// formatV1 is the first byte of a sealed blob:
//
//	0x01 | len(id) | id | nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// The bytes before the nonce are authenticated with the caller's
// associated data.
const formatV1 = 1

// Key is one secret of a Keyring, named by its ID.
type Key struct {
	// ID names the key in everything it seals. See ValidID.
	ID string
	// Secret is KeySize random bytes.
	Secret []byte
}

// Keyring seals with its first key and opens with any of its keys. It is
// safe for concurrent use, and implements idemstore.Sealer.
type Keyring struct {
	keys []ringKey // keys[0] seals
}

type ringKey struct {
	id   string
	aead cipher.AEAD
	// labelKey keys the digests of scope labels (label.go).
	labelKey []byte
}

var _ idemstore.Sealer = (*Keyring)(nil)

// New returns a Keyring that seals with keys[0] and opens with every key.
// It fails on no keys, a secret that is not KeySize bytes, an invalid ID or
// one given twice.
func New(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("idemseal: a keyring needs at least one key")
	}
	k := &Keyring{}
	for i, key := range keys {
		if err := ValidID(key.ID); err != nil {
			return nil, fmt.Errorf("idemseal: key %d: %w", i+1, err)
		}
		if len(key.Secret) != KeySize {
			return nil, fmt.Errorf("idemseal: key %q is %d bytes; want %d random bytes (AES-256)", key.ID, len(key.Secret), KeySize)
		}
		if slices.ContainsFunc(k.keys, func(r ringKey) bool { return r.id == key.ID }) {
			return nil, fmt.Errorf("idemseal: key ID %q appears twice", key.ID)
		}
		block, err := aes.NewCipher(key.Secret)
		if err != nil {
			return nil, fmt.Errorf("idemseal: key %q: %w", key.ID, err)
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, fmt.Errorf("idemseal: key %q: %w", key.ID, err)
		}
		labelKey, err := hkdf.Key(sha256.New, key.Secret, nil, labelDigestInfo, sha256.Size)
		if err != nil {
			return nil, fmt.Errorf("idemseal: key %q: %w", key.ID, err)
		}
		k.keys = append(k.keys, ringKey{id: key.ID, aead: aead, labelKey: labelKey})
	}
	return k, nil
}

// ValidID checks a key ID: 1 to MaxIDLength letters, digits, '.', '_' or
// '-'.
func ValidID(id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("key ID %q must be 1 to %d characters", id, MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("key ID %q may hold only letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// ID returns the ID of the key that seals.
func (k *Keyring) ID() string { return k.keys[0].id }

// IDs returns the IDs of every key, the one that seals first.
func (k *Keyring) IDs() []string {
	ids := make([]string, len(k.keys))
	for i, r := range k.keys {
		ids[i] = r.id
	}
	return ids
}

// seal encrypts plaintext with the sealing key, authenticating the blob's
// header and b with it, and returns the blob. The blob and the associated
// data share one allocation: the data sits past the blob's end.
func (k *Keyring) seal(plaintext []byte, b *binding) []byte {
	r := &k.keys[0]
	hdr := 2 + len(r.id)
	size := hdr + r.aead.Overhead() + len(plaintext)
	adLen := hdr + b.size()
	buf := make([]byte, 0, size+adLen)
	buf = append(buf, formatV1, byte(len(r.id)))
	buf = append(buf, r.id...)
	ad := append(buf[size:size], buf[:hdr]...)
	ad = b.appendTo(ad)
	return r.aead.Seal(buf, nil, plaintext, ad)[:size:size]
}

// open decrypts a blob that seal made with the same binding. It fails,
// with an error wrapping idemstore.ErrSealed, when sealed is malformed,
// names a key the ring does not hold, or was altered, or when the binding
// differs.
func (k *Keyring) open(sealed []byte, b *binding) ([]byte, error) {
	if len(sealed) < 2 || sealed[0] != formatV1 {
		return nil, fmt.Errorf("%w: not a sealed blob of a known format", idemstore.ErrSealed)
	}
	hdr := 2 + int(sealed[1])
	if len(sealed) < hdr {
		return nil, fmt.Errorf("%w: truncated", idemstore.ErrSealed)
	}
	id := sealed[2:hdr]
	var r *ringKey
	for i := range k.keys {
		if k.keys[i].id == string(id) {
			r = &k.keys[i]
			break
		}
	}
	if r == nil {
		return nil, fmt.Errorf("%w: sealed with key %q, which is not configured", idemstore.ErrSealed, printable(id))
	}
	// The associated data and the plaintext share one allocation.
	adLen := hdr + b.size()
	buf := make([]byte, 0, adLen+max(len(sealed)-hdr-r.aead.Overhead(), 0))
	ad := b.appendTo(append(buf, sealed[:hdr]...))
	out, err := r.aead.Open(ad[len(ad):], nil, sealed[hdr:], ad)
	if err != nil {
		return nil, fmt.Errorf("%w: does not open with key %q: altered, or moved from another record", idemstore.ErrSealed, r.id)
	}
	return out, nil
}

// printable returns id for an error message, or a placeholder when it is
// not a valid ID (a corrupted blob).
func printable(id []byte) string {
	if ValidID(string(id)) != nil {
		return "(malformed)"
	}
	return string(id)
}
