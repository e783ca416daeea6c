"""What every strategy shares: Strategy/Engine, the layout and rank map, gradient clipping, timers."""
