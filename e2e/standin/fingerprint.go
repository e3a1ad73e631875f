package standin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
)

// keySize is the length of a fingerprint key in bytes.
const keySize = 32

// tokenMAC is HMAC-SHA256(key, token). Emulated Ray keeps only this, never the token, and compares
// MACs in constant time, which is the same as comparing tokens.
type tokenMAC [sha256.Size]byte

// Fingerprint is the short name of a token that tests and the JSON endpoint show: the first 8
// bytes of its MAC in hex. Without the key it reveals nothing about the token, not even offline.
func (m tokenMAC) Fingerprint() string { return hex.EncodeToString(m[:8]) }

func (m tokenMAC) equal(o tokenMAC) bool { return hmac.Equal(m[:], o[:]) }

// Fingerprinter computes token MACs under one control plane's key.
type Fingerprinter struct{ key []byte }

// NewFingerprinter uses key (at least 32 bytes).
func NewFingerprinter(key []byte) (*Fingerprinter, error) {
	if len(key) < keySize {
		return nil, fmt.Errorf("fingerprint key: %d bytes, want at least %d", len(key), keySize)
	}
	return &Fingerprinter{key: append([]byte(nil), key...)}, nil
}

// LoadFingerprinter reads the key file written by WriteKey.
func LoadFingerprinter(path string) (*Fingerprinter, error) {
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fingerprint key: %w", err)
	}
	return NewFingerprinter(key)
}

// WriteKey writes a new random key to path, readable by its owner only.
func WriteKey(path string) error {
	key := make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	return os.WriteFile(path, key, 0o600)
}

func (f *Fingerprinter) mac(token string) tokenMAC {
	h := hmac.New(sha256.New, f.key)
	h.Write([]byte(token))
	var m tokenMAC
	copy(m[:], h.Sum(nil))
	return m
}

// Fingerprint names token as the stand-in reports it.
func (f *Fingerprinter) Fingerprint(token string) string { return f.mac(token).Fingerprint() }
