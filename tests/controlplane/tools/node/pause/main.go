// Command pause is the test node's sandbox ("pause") container: it holds a pod's namespaces
// and sleeps until it is told to stop. No registry is reachable from the test machine, so the
// kubelet's sandbox image is built from this (see ../../../node).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	// As PID 1 of the sandbox, children are only ever orphans: reap them.
	reap := make(chan os.Signal, 1)
	signal.Notify(reap, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-reap:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
