// Package sdktest holds only tests: it captures the exact request bodies
// that the official Go SDKs (anthropic-sdk-go v2, openai-go v3) send to a
// fake provider on 127.0.0.1 and checks that broker/wire admits them, and
// refuses them once mutated. It is a separate package so that the fuzz
// binary of broker/wire does not have to compile the SDKs.
package sdktest
