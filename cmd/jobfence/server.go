package main

import (
	"context"
	"errors"
)

func runServer(ctx context.Context, args []string) error { return errors.New("server: not built yet") }
