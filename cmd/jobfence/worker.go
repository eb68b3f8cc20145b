package main

func runWorker(args []string) int { return 127 }
