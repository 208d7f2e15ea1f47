//go:build ibv

// Built with the ibv tag: the rdma provider (smcr/verbs/ibv over libibverbs) is in.

package main

func init() { ibvBuilt = true }
