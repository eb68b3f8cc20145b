//go:build unix

package agent

import "golang.org/x/sys/unix"

// unixSignalName gives the SIGxxx name of a signal number.
func unixSignalName(n int) string {
	if name := unix.SignalName(unix.Signal(n)); name != "" {
		return name
	}
	return "SIGNAL_" + itoa(n)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
