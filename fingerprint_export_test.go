package idem

// FingerprintV1 is the fingerprint of version v1, for tests of records
// stored before version v2.
func FingerprintV1(in FingerprintInput, opts FingerprintOptions) (string, error) {
	return fingerprintV1(in, opts)
}
