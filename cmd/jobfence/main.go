// Command jobfence runs the server, the agent, the isolation canary, a one-machine
// dev setup and the host doctor. Flags may also be given as JOBFENCE_<FLAG>
// environment variables (dashes become underscores, upper case).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: jobfence <command> [flags]

commands:
  server   run the API, dashboard, read model and (when elected) the dispatcher
  agent    run jobs dispatched by the server in isolated worker domains
  dev      embedded etcd, a server and a local agent in one process tree
  doctor   check whether this host can isolate workers
  version  print the version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	if cmd == "worker" {
		// The isolation preflight's canary: it blocks until the preflight
		// kills its domain, so it takes none of the signal wiring below.
		os.Exit(runWorker(args))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "server":
		err = runServer(ctx, args)
	case "agent":
		err = runAgent(ctx, args)
	case "dev":
		err = runDev(ctx, args)
	case "doctor":
		stop()
		os.Exit(runDoctor(args))
	case "version", "--version", "-v":
		fmt.Println("jobfence", version)
		return
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "jobfence: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jobfence:", err)
		os.Exit(1)
	}
}
