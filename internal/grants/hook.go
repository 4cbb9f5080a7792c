package grants

// AfterPlan runs in the supervisor between planning the grants and the
// namespace that mounts them opening them again: the moment a second
// sandbox would swap a path. It does nothing, except in a binary built
// with the moat_test_hooks tag (tests only, like the lying backend),
// where the tests use it to drive that swap deterministically.
var AfterPlan = func() {}
