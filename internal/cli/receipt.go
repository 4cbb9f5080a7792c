package cli

import (
	"crypto/ed25519"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/audit"
)

func newAuditReceiptCmd() *cobra.Command {
	var pubPath, fingerprint string
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "receipt JOURNAL|RUNDIR SEQ [--pubkey FILE] [--key-fingerprint HEX] [-o json|yaml]",
		Short: "Print the receipt of one completed request: its digests, usage, seqs and line hashes",
		Long: `Print the receipt of the completed request whose completion record
(inference.completed, tool.completed or service.completed) or pre-effect
record (inference.requested, tool.requested, service.requested) is on
line SEQ of the journal. The receipt names the request's digest, the
response's digest, the provider's reported usage, and the seq and sha256
of both journal lines; it is derived from those signed lines only, after
the journal is verified through the completion line with the run's key
(--pubkey, by default pubkey.pem beside the journal; pin it with
--key-fingerprint). With -o json the receipt is printed in its canonical
form (RFC 8785 JSON), one line, to be kept and checked later with "moat audit
verify-receipt". Exit 0 with a receipt, 1 when there is none (no
completed request at SEQ, or the journal does not verify through it).`,
		Example: `  moat audit receipt .moat/runs/<run> 5
  moat audit receipt .moat/runs/<run> 5 -o json > receipt.json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil || seq < 1 {
				return exitf(exitUsage, "SEQ %q is not a line number (1, 2, …)", args[1])
			}
			pin, err := parseFingerprint(fingerprint)
			if err != nil {
				return exitf(exitUsage, "--key-fingerprint: %v", err)
			}
			journalPath, keyPath := runPaths(args[0], pubPath)
			journal, pub, err := loadJournalKey(journalPath, keyPath, pin)
			if err != nil {
				return err
			}
			r, err := audit.MakeReceipt(journal, seq, pub)
			if err != nil {
				return exitf(ExitInvalid, "audit receipt: %v", err)
			}
			out := cmd.OutOrStdout()
			if pin == "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: %s: the key came from %s, not from a pin (this key's is %s)\n", unpinnedWarning, keyPath, audit.KeyID(pub))
			}
			if output.machine() && output.value == formatYAML {
				return output.write(out, r)
			}
			if output.machine() {
				b, err := r.Encode()
				if err != nil {
					return exitf(ExitRefused, "BUG: encoding the receipt: %v", err)
				}
				_, err = out.Write(append(b, '\n'))
				return err
			}
			writeReceipt(out, r)
			return nil
		},
	}
	cmd.Flags().StringVar(&pubPath, "pubkey", "", "the run's public key (default: pubkey.pem beside the journal)")
	cmd.Flags().StringVar(&fingerprint, "key-fingerprint", "", "the run key's fingerprint as moat run printed it (64 hex digits)")
	output = addOutput(cmd)
	return cmd
}

func writeReceipt(w io.Writer, r *audit.Receipt) {
	fmt.Fprintf(w, "receipt: %s %s %s/%s, run %s, key %s\n", r.Road, r.ID, r.Target, r.Name, r.Run, r.KeyID)
	fmt.Fprintf(w, "  request   seq %d %s sha256 %s (line %s)\n", r.Request.Seq, r.Request.Type, r.Request.SHA256, r.Request.LineSHA256)
	fmt.Fprintf(w, "  response  seq %d %s sha256 %s (line %s)\n", r.Response.Seq, r.Response.Type, r.Response.SHA256, r.Response.LineSHA256)
	if r.Status != 0 {
		fmt.Fprintf(w, "  status    %d\n", r.Status)
	}
	if r.Usage != nil {
		fmt.Fprintf(w, "  usage     %d input, %d output tokens\n", r.Usage.InputTokens, r.Usage.OutputTokens)
	}
	if r.ApprovalID != "" {
		fmt.Fprintf(w, "  approval  %s\n", r.ApprovalID)
	}
}

// loadJournalKey reads a journal and its key, checking the key against
// pin when one is given.
func loadJournalKey(journalPath, keyPath, pin string) ([]byte, ed25519.PublicKey, error) {
	pemBytes, err := readCapped(keyPath, audit.MaxPublicKeyPEM)
	if err != nil {
		return nil, nil, exitf(ExitInvalid, "reading the public key: %v", err)
	}
	pub, err := audit.ParsePublicKeyPEM(pemBytes)
	if err != nil {
		return nil, nil, exitf(ExitInvalid, "%s: %v", keyPath, err)
	}
	if pin != "" && audit.KeyID(pub) != pin {
		return nil, nil, exitf(ExitInvalid, "the key %s has fingerprint %s, not the pinned %s", keyPath, audit.KeyID(pub), pin)
	}
	journal, err := readCapped(journalPath, audit.MaxJournalBytes)
	if err != nil {
		return nil, nil, exitf(ExitInvalid, "reading the journal: %v", err)
	}
	return journal, pub, nil
}

// verifyReceiptJSON is verify-receipt's -o json form.
type verifyReceiptJSON struct {
	Valid    bool           `json:"valid"`
	Reason   string         `json:"reason,omitempty"`
	Journal  string         `json:"journal"`
	KeyID    string         `json:"keyid,omitempty"`
	Receipt  *audit.Receipt `json:"receipt,omitempty"`
	ExitCode int            `json:"exit_code"`
}

func newAuditVerifyReceiptCmd() *cobra.Command {
	var journalArg, keyPath, fingerprint string
	var output *outputFlag
	cmd := &cobra.Command{
		Use:   "verify-receipt RECEIPT --journal JOURNAL|RUNDIR (--key PUB | --key-fingerprint HEX) [-o json|yaml]",
		Short: "Check a receipt against the journal and a pinned key, offline: exit 0 valid, 1 not",
		Long: `Check a receipt (as "moat audit receipt -o json" printed it) against the
run's journal and key, offline: the receipt's keyid is the key's, the
journal verifies with the key through the receipt's response line, the
lines at the receipt's two seqs have its line hashes, and every member
(digests, usage, status, ids) is what those lines say.

The key must be pinned: --key names a copy of the run's pubkey.pem kept
apart from the run directory, or --key-fingerprint gives the 64 hex
digits that moat run printed (then the key is pubkey.pem beside the
journal and must have that fingerprint); with both, they must agree.

Exit codes: 0 the receipt is backed by the journal; 1 it is not (a
member differs, the journal ends before its lines or does not verify up
to them, another key) or a file cannot be read; 125 a usage error.`,
		Example: `  moat audit verify-receipt receipt.json --journal .moat/runs/<run> --key-fingerprint 9f2c…(64 hex digits)
  moat audit verify-receipt receipt.json --journal journal.jsonl --key kept/pubkey.pem -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if journalArg == "" {
				return exitf(exitUsage, "verify-receipt needs --journal JOURNAL|RUNDIR")
			}
			if keyPath == "" && fingerprint == "" {
				return exitf(exitUsage, "verify-receipt needs a pinned key: --key PUB or --key-fingerprint HEX (a receipt checked against the key in the run directory proves nothing)")
			}
			pin, err := parseFingerprint(fingerprint)
			if err != nil {
				return exitf(exitUsage, "--key-fingerprint: %v", err)
			}
			journalPath, kp := runPaths(journalArg, keyPath)
			report := func(r *audit.Receipt, keyID string, verr error) error {
				code := 0
				if verr != nil {
					code = ExitInvalid
				}
				out := cmd.OutOrStdout()
				if output.machine() {
					j := verifyReceiptJSON{Valid: verr == nil, Journal: journalPath, KeyID: keyID, Receipt: r, ExitCode: code}
					if verr != nil {
						j.Reason = verr.Error()
					}
					if err := output.write(out, j); err != nil {
						return err
					}
					return exitCode(code)
				}
				if verr != nil {
					fmt.Fprintf(out, "INVALID: %v\n", verr)
				} else {
					fmt.Fprintf(out, "valid: %s %s, request seq %d, response seq %d, run %s, key %s (pinned)\n",
						r.Road, r.ID, r.Request.Seq, r.Response.Seq, r.Run, keyID)
				}
				return exitCode(code)
			}
			b, err := readCapped(args[0], audit.MaxReceiptBytes)
			if err != nil {
				return report(nil, "", fmt.Errorf("reading the receipt: %v", err))
			}
			r, err := audit.ParseReceipt(b)
			if err != nil {
				return report(nil, "", err)
			}
			journal, pub, err := loadJournalKey(journalPath, kp, pin)
			if err != nil {
				return report(r, "", err)
			}
			return report(r, audit.KeyID(pub), audit.VerifyReceipt(r, journal, pub))
		},
	}
	cmd.Flags().StringVar(&journalArg, "journal", "", "the run's journal, or its run directory")
	cmd.Flags().StringVar(&keyPath, "key", "", "the run's public key (PEM), kept apart from the run directory")
	cmd.Flags().StringVar(&fingerprint, "key-fingerprint", "", "the run key's fingerprint as moat run printed it (64 hex digits)")
	output = addOutput(cmd)
	return cmd
}
