package cli

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/audit"
)

func init() { addCommand(newAuditCmd) }

func newAuditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Verify and read signed run journals",
		Long: `Every run writes a signed, hash-chained journal (journal.jsonl) and its
public key (pubkey.pem) into its run directory. These commands check and
show it.`,
		Example: `  moat audit verify .moat/runs/<run>/journal.jsonl --pubkey .moat/runs/<run>/pubkey.pem
  moat audit show .moat/runs/<run>/journal.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newAuditVerifyCmd(), newAuditShowCmd(), newAuditReceiptCmd(), newAuditVerifyReceiptCmd())
	return cmd
}

// exitUnpinned is the exit code of a verifier run with --require-pin that
// found the journal or bundle valid but was given no pin to check it
// against.
const exitUnpinned = 3

// unpinnedWarning is printed on stderr by every verifier that found its
// input valid without a pin: it is intact, but anyone could have made it.
const unpinnedWarning = "UNPINNED: authenticity not established"

func newAuditVerifyCmd() *cobra.Command {
	var pubPath, fingerprint string
	var requirePin bool
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "verify JOURNAL|RUNDIR [--key-fingerprint HEX] [--pubkey FILE] [--require-pin] [-o json|yaml]",
		Short: "Check a journal's signatures and chain: exit 0 complete, 2 incomplete, 1 invalid, 3 unpinned",
		Long: `Check every line of a journal against the run's public key, on the exact
bytes of the file: the DSSE envelope form, the Ed25519 signature, the
canonical payload, the record's fields, the sequence numbers and the hash
chain (each prev is the sha256 of the line before). JOURNAL may be the run
directory; the key is --pubkey, by default pubkey.pem beside the journal.

A journal is only as authentic as its key: anyone can write a journal of
their own, sign it with a fresh key and replace pubkey.pem. Pin the key
with --key-fingerprint HEX, the 64 hex digits that moat run printed when
it started ("key …"; the sha256 of the raw Ed25519 key, the journal's
keyid). Without a pin, verify still reports the journal's own state but
prints "` + unpinnedWarning + `" on stderr and "pinned": false
with -o json or yaml.

Exit codes:
  0  complete: every line is valid and the terminal run.terminated is last
  2  incomplete: a valid prefix without a terminal record, possibly ending
     in a torn line that a crash left (the run was killed or still runs);
     also a run directory whose journal was never created
  1  invalid: the first bad line is named with the reason (bad signature,
     broken link, wrong key, sequence gap, duplicate, non-canonical payload,
     unknown record type, data after the terminal record, …); a key whose
     fingerprint is not the pinned one; or the journal or the key cannot
     be read
  3  unpinned: with --require-pin, a journal that would exit 0 or 2 but
     was checked without --key-fingerprint`,
		Example: `  moat audit verify .moat/runs/<run> --key-fingerprint 9f2c…(64 hex digits)
  moat audit verify .moat/runs/<run>/journal.jsonl --pubkey .moat/runs/<run>/pubkey.pem --key-fingerprint 9f2c… --require-pin
  moat audit verify journal.jsonl --pubkey pubkey.pem -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pin, err := parseFingerprint(fingerprint)
			if err != nil {
				return exitf(exitUsage, "--key-fingerprint: %v", err)
			}
			journalPath, keyPath := runPaths(args[0], pubPath)
			res, pinned := audit.VerifyFiles(journalPath, keyPath, pin)
			code := res.Status.ExitCode()
			if !pinned && code != ExitInvalid {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: %s: the key came from %s, not from a pin; pass --key-fingerprint with the keyid that moat run printed (this key's is %s)\n", unpinnedWarning, keyPath, res.KeyID)
				if requirePin {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: audit verify: --require-pin: exit %d instead of %d\n", exitUnpinned, code)
					code = exitUnpinned
				}
			}
			out := cmd.OutOrStdout()
			if output.machine() {
				if err := output.write(out, verifyJSON{Result: res, ExitCode: code, Journal: journalPath, Pinned: pinned}); err != nil {
					return err
				}
				return exitCode(code)
			}
			switch res.Status {
			case audit.Complete:
				t := res.Terminal
				fmt.Fprintf(out, "complete: %d records, run %s, key %s%s; terminated: %s (exit code %d)\n",
					res.Records, res.RunID, res.KeyID, pinNote(pinned), t.Reason, t.ExitCode)
			case audit.Incomplete:
				fmt.Fprintf(out, "incomplete: %s (key %s%s)\n", res.Reason, res.KeyID, pinNote(pinned))
			default:
				fmt.Fprintf(out, "INVALID: %s\n", res.Reason)
			}
			return exitCode(code)
		},
	}
	cmd.Flags().StringVar(&pubPath, "pubkey", "", "the run's public key (default: pubkey.pem beside the journal)")
	cmd.Flags().StringVar(&fingerprint, "key-fingerprint", "", "the run key's fingerprint as moat run printed it: sha256 of the raw Ed25519 key, 64 hex digits")
	cmd.Flags().BoolVar(&requirePin, "require-pin", false, "exit 3 instead of 0 or 2 when no --key-fingerprint is given")
	output = addOutput(cmd)
	return cmd
}

func pinNote(pinned bool) string {
	if pinned {
		return ", pinned"
	}
	return ", UNPINNED"
}

// parseFingerprint checks a pinned fingerprint: "" (no pin) or 64 hex
// digits, returned in lower case.
func parseFingerprint(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if len(s) != 64 {
		return "", fmt.Errorf("%q is %d characters; want the 64 hex digits of a sha256", s, len(s))
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", fmt.Errorf("%q is not hex; want the 64 hex digits of a sha256", s)
	}
	return strings.ToLower(s), nil
}

// runPaths resolves verify's argument: a run directory or a journal, and
// the key file (default: pubkey.pem beside the journal).
func runPaths(arg, pubPath string) (journal, key string) {
	journal = arg
	if fi, err := os.Stat(arg); err == nil && fi.IsDir() {
		journal = filepath.Join(arg, audit.JournalFile)
	}
	if pubPath == "" {
		pubPath = filepath.Join(filepath.Dir(journal), audit.PublicKeyFile)
	}
	return journal, pubPath
}

// verifyJSON is the -o json form of a verification.
type verifyJSON struct {
	audit.Result
	ExitCode int    `json:"exit_code"`
	Journal  string `json:"journal"`
	Pinned   bool   `json:"pinned"`
}

// readCapped reads a regular file of at most limit bytes.
func readCapped(path string, limit int64) ([]byte, error) { return audit.ReadFileCapped(path, limit) }

func newAuditShowCmd() *cobra.Command {
	var pubPath string
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "show JOURNAL [--pubkey FILE] [-o json|yaml]",
		Short: "Print a journal as a readable timeline",
		Long: `Print one line per record: time, sequence number, type and the record's key
fields. Refused and failed requests are marked "!!". Without --pubkey the
signatures are NOT checked (use "moat audit verify" for that); with it, the
verdict follows the timeline and the exit code is verify's.`,
		Example: `  moat audit show .moat/runs/<run>/journal.jsonl
  moat audit show journal.jsonl --pubkey pubkey.pem
  moat audit show journal.jsonl -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			journal, err := readCapped(args[0], audit.MaxJournalBytes)
			if err != nil {
				return exitf(ExitInvalid, "reading the journal: %v", err)
			}
			out := cmd.OutOrStdout()
			if output.machine() {
				recs, perr := audit.Payloads(journal)
				if err := output.write(out, recs); err != nil {
					return err
				}
				if perr != nil {
					return exitf(ExitInvalid, "%v", perr)
				}
			} else {
				audit.WriteTimeline(out, journal)
			}
			if pubPath == "" {
				if !output.machine() {
					fmt.Fprintln(out, "(signatures not checked: pass --pubkey, or run moat audit verify)")
				}
				return nil
			}
			pemBytes, err := readCapped(pubPath, audit.MaxPublicKeyPEM)
			if err != nil {
				return exitf(ExitInvalid, "reading the public key: %v", err)
			}
			pub, err := audit.ParsePublicKeyPEM(pemBytes)
			if err != nil {
				return exitf(ExitInvalid, "%s: %v", pubPath, err)
			}
			res := audit.Verify(journal, pub)
			if !output.machine() {
				if res.Status == audit.Complete {
					fmt.Fprintf(out, "verified: complete, %d records\n", res.Records)
				} else {
					fmt.Fprintf(out, "verified: %s: %s\n", res.Status, res.Reason)
				}
			}
			return exitCode(res.Status.ExitCode())
		},
	}
	cmd.Flags().StringVar(&pubPath, "pubkey", "", "also verify against this public key")
	output = addOutput(cmd)
	return cmd
}
