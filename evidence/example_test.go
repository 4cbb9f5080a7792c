package evidence

import "fmt"

// A refusal case whose refusals held but whose "after" control never
// arrived is insufficient: the refusal may just be a broken broker.
func ExampleScore() {
	c, _ := CaseByName("unapproved-model")
	t := true
	o := Observations{RunInfo: true, Journal: JournalComplete, Terminal: "completed", ProviderEvents: true,
		Verified: 1, ControlsSeen: []string{"before"},
		ReceiverControls: map[string]bool{RecvTCP: true, RecvUDP: true, RecvAbstract: true, RecvUnix: true, RecvUnixgram: true},
		NetNSPrivate:     &t, MntNSPrivate: &t, NoNewPrivs: &t, WorkerGone: &t, StagingRemoved: &t}
	outcome, reasons := Score(c, o)
	fmt.Println(outcome)
	fmt.Println(reasons[0])
	o.AttackAtProvider = 1
	outcome, reasons = Score(c, o)
	fmt.Println(outcome)
	fmt.Println(reasons[0])
	// Output:
	// insufficient
	// useful-work control "after" did not reach the provider verified
	// fail
	// the attack marker reached the provider in 1 request(s)
}

func ExampleParseClaims() {
	out := []byte(`{"step":"control:before","status":200}
{"claims":{"passed":true,"escape_success":true,"audit_verified":true}}
`)
	fmt.Printf("%+v\n", ParseClaims(out))
	// Output:
	// {Present:true Passed:true EscapeSuccess:true AuditVerified:true}
}
