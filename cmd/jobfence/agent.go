package main

import (
	"context"
	"errors"
)

func runAgent(ctx context.Context, args []string) error { return errors.New("agent: not built yet") }
