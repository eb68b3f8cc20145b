package main

func runDoctor(args []string) int { return 1 }
