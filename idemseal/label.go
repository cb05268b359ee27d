package idemseal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.LabelSealer = (*Keyring)(nil)

// labelDigestInfo derives, from each key's secret, the key of the label
// digests it makes (HKDF-SHA256), so that a digest reveals nothing of the
// secret that seals.
const labelDigestInfo = "idem scope label digest v1"

// labelDigestSize is the bytes of HMAC-SHA256 a label's digest keeps.
const labelDigestSize = 16

// labelIndex returns the idemstore.ScopeLabelIndex of label sealed with r:
// SealedLabelPrefix, the key's ID, '.' and the hex of the label's keyed
// digest. Records that share a label share it, under one key.
func (r *ringKey) labelIndex(label string) string {
	m := hmac.New(sha256.New, r.labelKey)
	m.Write([]byte(label))
	return idemstore.SealedLabelPrefix + r.id + "." + hex.EncodeToString(m.Sum(nil)[:labelDigestSize])
}

// SealLabel returns label sealed, bound to key and to its digest:
// SealedLabelPrefix, the digest under the sealing key (see labelIndex),
// ':' and the sealed label in base64url. An empty label stays empty. A
// nil Keyring seals nothing.
func (k *Keyring) SealLabel(key idemstore.Key, label string) (string, error) {
	if k == nil || label == "" {
		return label, nil
	}
	index := k.keys[0].labelIndex(label)
	blob := k.seal([]byte(label), &binding{purpose: forLabel, key: &key, index: index})
	return index + ":" + base64.RawURLEncoding.EncodeToString(blob), nil
}

// OpenLabel returns the label that sealed seals. A label that is not
// sealed is returned as it is.
func (k *Keyring) OpenLabel(key idemstore.Key, sealed string) (string, error) {
	if !idemstore.IsSealedLabel(sealed) {
		return sealed, nil
	}
	if k == nil {
		return "", fmt.Errorf("%w: its label is sealed, and no key to open it is configured", idemstore.ErrSealed)
	}
	index := idemstore.ScopeLabelIndex(sealed)
	if len(index) == len(sealed) {
		return "", fmt.Errorf("%w: a sealed label without its sealed part", idemstore.ErrSealed)
	}
	blob, err := base64.RawURLEncoding.DecodeString(sealed[len(index)+1:])
	if err != nil {
		return "", fmt.Errorf("%w: a sealed label that is not base64url", idemstore.ErrSealed)
	}
	plain, err := k.open(blob, &binding{purpose: forLabel, key: &key, index: index})
	if err != nil {
		return "", err
	}
	return string(plain), nil
}

// ScopeLabelIndexes returns the idemstore.ScopeLabelIndex of label as
// each key of the ring seals it, the sealing key's first, for a search
// that finds labels sealed before a rotation too. label is cleaned as the
// engine cleans what it stores (idemstore.CleanScopeLabel).
func (k *Keyring) ScopeLabelIndexes(label string) []string {
	label = idemstore.CleanScopeLabel(label)
	if k == nil || label == "" {
		return nil
	}
	out := make([]string, len(k.keys))
	for i := range k.keys {
		out[i] = k.keys[i].labelIndex(label)
	}
	return out
}
