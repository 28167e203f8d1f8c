package main

// The components run side by side in goroutines; the first to fail stops them all.

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/klog/v2"
)

type components struct {
	ctx     context.Context
	cancel  context.CancelFunc
	group   sync.WaitGroup
	once    sync.Once
	err     error
	failure chan struct{} // closed when the first component fails
}

func newComponents(parent context.Context) *components {
	ctx, cancel := context.WithCancel(parent)
	return &components{ctx: ctx, cancel: cancel, failure: make(chan struct{})}
}

// start runs a component until the context ends; one that returns before is a failure.
func (c *components) start(name string, run func(context.Context) error) {
	c.group.Add(1)
	go func() {
		defer c.group.Done()
		err := run(c.ctx)
		if c.ctx.Err() != nil {
			return // stopping: whatever it returned is the end we asked for
		}
		if err == nil {
			err = fmt.Errorf("stopped on its own")
		}
		c.once.Do(func() {
			c.err = fmt.Errorf("%s: %w", name, err)
			klog.Errorf("%v", c.err)
			close(c.failure)
		})
		c.cancel()
	}()
}

func (c *components) failed() <-chan struct{} { return c.failure }

// stop ends every component and waits for them.
func (c *components) stop() {
	c.cancel()
	c.group.Wait()
}

// wait blocks until the components end (a signal, or a failure) and returns the failure.
func (c *components) wait() error {
	<-c.ctx.Done()
	c.group.Wait()
	return c.err
}
