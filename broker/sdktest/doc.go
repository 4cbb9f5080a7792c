// Package sdktest holds only tests: the official Go SDKs (anthropic-sdk-go
// v2, openai-go v3), configured only from broker.WorkloadEnv, talk through
// a real broker to a fake provider on 127.0.0.1. It is a separate package
// so that the broker's fuzz binary does not have to compile the SDKs.
package sdktest
