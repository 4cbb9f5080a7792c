package seccomp

// archModeProbes: arm64 has only the *at forms, which the "file-modes"
// kernel case covers on both architectures.
var archModeProbes []probe

// archDeviceProbes: arm64 has no mknod, only mknodat.
var archDeviceProbes []probe
