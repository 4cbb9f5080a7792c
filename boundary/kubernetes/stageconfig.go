package kubernetes

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-json-experiment/json"

	"github.com/moat-sandbox/moat/boundary"
)

// The stage's frame at the head of an exec's stdin: stageMagic, the
// length of the JSON that follows as 4 bytes big-endian, then the JSON
// stageConfig. Everything after it is the workload's stdin.
const (
	stageMagic     = "moatstg1"
	stageHeaderLen = len(stageMagic) + 4
)

// The stage's arguments besides none (the frame on stdin): stageSave
// reads a frame from stdin and saves it in procDir for a terminal exec;
// `stageLoad ID SHA256` runs the frame saved for ID, which must have that
// digest.
const (
	stageSave = "save"
	stageLoad = "load"
)

// encodeStageFrame is cfg as the stage's frame; a configuration over
// maxStageConfigBytes is refused as the workload's start error.
func encodeStageFrame(cfg stageConfig) ([]byte, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if len(b) > maxStageConfigBytes {
		return nil, &boundary.StartError{Code: boundary.ExitRefused, Msg: fmt.Sprintf("command and environment take %d bytes, at most %d on the kubernetes backend", len(b), maxStageConfigBytes)}
	}
	f := make([]byte, stageHeaderLen, stageHeaderLen+len(b))
	copy(f, stageMagic)
	binary.BigEndian.PutUint32(f[len(stageMagic):], uint32(len(b)))
	return append(f, b...), nil
}

// readStageFrame reads one frame from r and not a byte more (r's
// remainder is the workload's stdin), and decodes it strictly; it
// returns the configuration and the frame's bytes. A wrong magic, a
// length of 0 or over maxStageConfigBytes (refused before anything past
// the header is read) and a stream that ends early are refused.
func readStageFrame(r io.Reader) (stageConfig, []byte, error) {
	h := make([]byte, stageHeaderLen)
	if _, err := io.ReadFull(r, h); err != nil {
		return stageConfig{}, nil, fmt.Errorf("no configuration frame on stdin: %w", err)
	}
	if string(h[:len(stageMagic)]) != stageMagic {
		return stageConfig{}, nil, fmt.Errorf("stdin does not start with a configuration frame (%q): the exec was not made by this moat", h[:len(stageMagic)])
	}
	n := binary.BigEndian.Uint32(h[len(stageMagic):])
	if n == 0 || n > maxStageConfigBytes {
		return stageConfig{}, nil, fmt.Errorf("configuration frame of %d bytes, want 1 to %d", n, maxStageConfigBytes)
	}
	f := make([]byte, stageHeaderLen+int(n))
	copy(f, h)
	if _, err := io.ReadFull(r, f[stageHeaderLen:]); err != nil {
		return stageConfig{}, nil, fmt.Errorf("configuration frame of %d bytes cut short: %w", n, err)
	}
	cfg, err := decodeStageConfig(string(f[stageHeaderLen:]))
	if err != nil {
		return stageConfig{}, nil, err
	}
	return cfg, f, nil
}

// stageFileName is where procDir keeps the frame saved for id.
func stageFileName(id string) string { return id + ".stage" }

// loadStageConfig reads, removes and checks the frame saved in dir for
// id: it must be a regular file (not followed if a symlink), hold one
// frame and nothing after it, have the SHA-256 sum (hex) that the
// terminal exec's command names, and be id's with a Nonce.
func loadStageConfig(dir, id, sum string) (stageConfig, error) {
	if !validID(id) {
		return stageConfig{}, fmt.Errorf("bad id %q", id)
	}
	want, err := hex.DecodeString(sum)
	if err != nil || len(want) != sha256.Size || hex.EncodeToString(want) != sum {
		return stageConfig{}, fmt.Errorf("bad digest %q", sum)
	}
	p := filepath.Join(dir, stageFileName(id))
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return stageConfig{}, fmt.Errorf("saved configuration: %w", err)
	}
	os.Remove(p)
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return stageConfig{}, errors.New("saved configuration: not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(stageHeaderLen+maxStageConfigBytes+1)))
	f.Close()
	if err != nil {
		return stageConfig{}, fmt.Errorf("saved configuration: %w", err)
	}
	if got := sha256.Sum256(b); !bytes.Equal(got[:], want) {
		return stageConfig{}, errors.New("the saved configuration does not have the digest the exec names")
	}
	r := bytes.NewReader(b)
	cfg, _, err := readStageFrame(r)
	switch {
	case err != nil:
		return stageConfig{}, fmt.Errorf("saved configuration: %w", err)
	case r.Len() != 0:
		return stageConfig{}, errors.New("saved configuration: bytes after the frame")
	case cfg.ID != id || cfg.Nonce == "":
		return stageConfig{}, fmt.Errorf("saved configuration: not %s's", id)
	}
	return cfg, nil
}

// decodeStageConfig parses the stage's configuration strictly: unknown
// members, an empty command, a bad id, a working directory that is not
// absolute and clean, or a nonce that is not 32 hex digits are refused.
func decodeStageConfig(s string) (stageConfig, error) {
	var cfg stageConfig
	if len(s) > maxStageConfigBytes {
		return cfg, fmt.Errorf("configuration of %d bytes, at most %d", len(s), maxStageConfigBytes)
	}
	if err := json.Unmarshal([]byte(s), &cfg, json.RejectUnknownMembers(true)); err != nil {
		return stageConfig{}, fmt.Errorf("bad configuration: %w", err)
	}
	switch {
	case len(cfg.Argv) == 0 || cfg.Argv[0] == "":
		return stageConfig{}, errors.New("bad configuration: no command")
	case !validID(cfg.ID):
		return stageConfig{}, fmt.Errorf("bad configuration: id %q", cfg.ID)
	case !filepath.IsAbs(cfg.Dir) || filepath.Clean(cfg.Dir) != cfg.Dir:
		return stageConfig{}, fmt.Errorf("bad configuration: working directory %q is not absolute and clean", cfg.Dir)
	case cfg.Nonce != "" && !validNonce(cfg.Nonce):
		return stageConfig{}, fmt.Errorf("bad configuration: nonce %q", cfg.Nonce)
	}
	for _, kv := range cfg.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return stageConfig{}, fmt.Errorf("bad configuration: environment entry %q", kv)
		}
	}
	for _, a := range cfg.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return stageConfig{}, errors.New("bad configuration: NUL in the command")
		}
	}
	return cfg, nil
}

// validID is a stage id as start makes them: "p" and a decimal number.
func validID(id string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "p"))
	return strings.HasPrefix(id, "p") && err == nil && n > 0 && len(id) < 16 && strconv.Itoa(n) == id[1:]
}

// validNonce is a nonce as start makes them: 32 lowercase hex digits.
func validNonce(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 16 && hex.EncodeToString(b) == s
}
