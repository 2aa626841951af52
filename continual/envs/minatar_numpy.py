"""MinAtar's games in numpy: every env of a vector env stepped by one set of array operations.

`continual.envs.batched.MinAtarVectorEnv` steps the envs whose game has a port here through it (the others through
MinAtar's Python game, one by one). A port plays exactly MinAtar's game: the same observations, rewards and
terminals for the same seeds and actions (tests/test_envs_minatar_numpy.py compares them with
`minatar.Environment` step by step). It holds the game state of a row between resets only: every reset still goes
through the env's wrapper stack and MinAtar's own `reset`, and `load` then copies the fresh state in.

Random draws: MinAtar draws one uniform from the env's RandomState per step (sticky actions, drawn even at
probability 0) and, in these games, little else between resets (Freeway: new car speeds after a crossing, drawn
from the RandomState itself, `game_random`). A row draws a block of them ahead from that very
RandomState (`random_sample(k)` is the same stream as k calls of `rand()`); `settle` rewinds the RandomState to
just after the draws used, before anything else (a reset, a game swap) draws from it. The rewind copies MT19937's
state struct in and out through its ctypes address (a microsecond; `get_state`/`set_state` cost ~40x that, paid at
every episode end), checked against `get_state` once, with `get_state`/`set_state` as the fallback.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from continual.envs.backends import MINATAR_PARAMETERS, MinAtarEnv

BLOCK = 256  # sticky-action draws taken ahead per row
N_, L_, U_, R_, D_, F_ = range(6)  # MinAtar's action indices (n, l, u, r, d, f)
_MT_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624]; int pos
_raw_copy_ok: Optional[bool] = None


def _state_address(rs: np.random.RandomState) -> Optional[int]:
    """The address of `rs`'s MT19937 state struct when copying it raw is checked to round-trip, else None."""
    global _raw_copy_ok
    try:
        addr = rs._bit_generator.ctypes.state_address
    except AttributeError:
        return None
    if _raw_copy_ok is None:
        probe = np.random.RandomState(12345)
        probe.random_sample(7)
        raw = np.empty(_MT_BYTES, np.uint8)
        paddr = probe._bit_generator.ctypes.state_address
        ctypes.memmove(raw.ctypes.data, paddr, _MT_BYTES)
        _, key, pos = probe.get_state()[:3]
        ahead = probe.random_sample(3)
        ctypes.memmove(paddr, raw.ctypes.data, _MT_BYTES)
        _raw_copy_ok = bool(np.array_equal(raw[:-4].view(np.uint32), key) and raw[-4:].view(np.int32)[0] == pos
                            and np.array_equal(probe.random_sample(3), ahead))
    return addr if _raw_copy_ok else None


class GamePort:
    """The rows of a vector env that play one game: per-row action maps, sticky actions and the draws ahead."""

    channels = 0

    def __init__(self, n: int, width: int):
        self.n = n
        self.rows = np.zeros(n, bool)  # which rows play this game now
        self.amap = np.zeros((n, width), np.int64)  # agent action -> MinAtar action (PadTask: missing = the last)
        self._amaps: dict[tuple, np.ndarray] = {}
        self.channel_perm: list = [None] * n  # observation channel j shows game channel perm[j] (None: identity)
        self.permuted = np.zeros(n, bool)
        self.sticky = np.zeros(n, np.float64)
        self.last = np.zeros(n, np.int64)
        self.terminal = np.zeros(n, bool)
        self._rs: list = [None] * n
        self._game_rs: list = [None] * n
        self._saved: list = [None] * n  # get_state() where the raw copy is not available
        self._addr: list = [None] * n
        self._raw = np.zeros((n, _MT_BYTES), np.uint8)
        self._raw_addr = self._raw.ctypes.data
        self._ahead = np.zeros((n, BLOCK), np.float64)
        self._used = np.zeros(n, np.int64)

    # ---- rows in and out ----
    def load(self, i: int, core) -> None:
        """Row i now plays `core` (a `MinAtarEnv` just reset): copy its state and draw ahead from its RandomState."""
        game = core.game
        actions = tuple(core._game_actions)  # `permute_actions`: the permuted table (the plain one otherwise)
        row = self._amaps.get(actions)
        if row is None:
            width = self.amap.shape[1]
            row = self._amaps[actions] = np.array([actions[min(k, len(actions) - 1)] for k in range(width)])
        self.amap[i] = row
        self.channel_perm[i] = None if core._channels is None else np.asarray(core._channels)  # `permute_obs`
        self.permuted[i] = core._channels is not None
        self.sticky[i] = game.sticky_action_prob
        self.last[i] = game.last_action
        self.terminal[i] = bool(game.env.terminal)
        self._rs[i], self._game_rs[i] = game.random, game.env.random
        self._addr[i] = _state_address(game.random)
        self._draw_ahead(i)
        self.rows[i] = True
        self.load_game(i, game.env)

    def settle(self, i: int) -> None:
        """Row i's RandomState as MinAtar would have left it (before a reset or a swap draws from it)."""
        if self._rs[i] is None:
            return
        self._rewind(i)
        self._rs[i] = self._game_rs[i] = self._saved[i] = self._addr[i] = None
        self.rows[i] = False

    def game_random(self, i: int) -> tuple[np.random.RandomState, bool]:
        """(the RandomState MinAtar's game draws from now, mid-episode; whether it is the sticky actions' one, then
        rewound to where MinAtar would be: call `_draw_ahead(i)` after drawing). They differ only before the first
        seeded reset (MinAtar's Environment and game each make one)."""
        if self._game_rs[i] is not self._rs[i]:
            return self._game_rs[i], False
        self._rewind(i)
        return self._rs[i], True

    def _rewind(self, i: int) -> None:
        if self._addr[i] is not None:
            ctypes.memmove(self._addr[i], self._raw_addr + int(i) * _MT_BYTES, _MT_BYTES)
        else:
            self._rs[i].set_state(self._saved[i])
        if self._used[i]:
            self._rs[i].random_sample(int(self._used[i]))

    def _draw_ahead(self, i: int) -> None:
        rs = self._rs[i]
        if self._addr[i] is not None:
            ctypes.memmove(self._raw_addr + int(i) * _MT_BYTES, self._addr[i], _MT_BYTES)
        else:
            self._saved[i] = rs.get_state()
        self._ahead[i] = rs.random_sample(BLOCK)
        self._used[i] = 0

    def _sticky_actions(self, idx: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """MinAtar's `Environment.act`: the action repeated with probability sticky (one draw per step)."""
        used = self._used[idx]
        for i in idx[used >= BLOCK]:  # a block used up: its RandomState is exactly past it, draw the next
            self._draw_ahead(i)
        used = self._used[idx]
        u = self._ahead[idx, used]
        self._used[idx] = used + 1
        a = self.amap[idx, actions]
        a = np.where(u < self.sticky[idx], self.last[idx], a)
        self.last[idx] = a
        return a

    def step(self, idx: np.ndarray, actions: np.ndarray, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step rows `idx` with agent actions `actions` (one per row); write their observations into obs[idx]
        (the first `channels` channels); return (rewards, terminals)."""
        a = self._sticky_actions(idx, actions)
        live = ~self.terminal[idx]  # a game over stays over: reward 0 (MinAtar's act returns at once)
        reward = self.step_game(idx, a, live)
        reward = np.where(live, reward, 0)
        self.terminal[idx] |= live & self._new_terminal
        obs[idx, :self.channels] = self.observe(idx)
        for i in idx[self.permuted[idx]]:
            obs[i, :self.channels] = obs[i, self.channel_perm[i]]
        return reward.astype(np.float64), self.terminal[idx].copy()

    # ---- per game ----
    def load_game(self, i: int, env) -> None:
        raise NotImplementedError

    def step_game(self, idx: np.ndarray, a: np.ndarray, live: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def observe(self, idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError


# Breakout: ball directions 0..3 = up-left, up-right, down-right, down-left
_DX = np.array([-1, 1, 1, -1])
_DY = np.array([-1, -1, 1, 1])
_FLIP_X = np.array([1, 0, 3, 2])
_FLIP_Y = np.array([3, 2, 1, 0])
_PADDLE_EDGE = np.array([2, 3, 0, 1])


class Breakout(GamePort):
    channels = 4  # paddle, ball, trail, brick

    def __init__(self, n: int, width: int):
        super().__init__(n, width)
        self.pos = np.zeros(n, np.int64)
        self.bx = np.zeros(n, np.int64)
        self.by = np.zeros(n, np.int64)
        self.dir = np.zeros(n, np.int64)
        self.lx = np.zeros(n, np.int64)
        self.ly = np.zeros(n, np.int64)
        self.strike = np.zeros(n, bool)
        self.bricks = np.zeros((n, 10, 10), bool)

    def load_game(self, i: int, env) -> None:
        self.pos[i], self.bx[i], self.by[i], self.dir[i] = env.pos, env.ball_x, env.ball_y, env.ball_dir
        self.lx[i], self.ly[i], self.strike[i] = env.last_x, env.last_y, env.strike
        self.bricks[i] = env.brick_map != 0

    def step_game(self, idx, a, live):
        m = len(idx)
        pos = self.pos[idx]
        pos = np.where(live & (a == L_), np.maximum(pos - 1, 0), pos)
        pos = np.where(live & (a == R_), np.minimum(pos + 1, 9), pos)
        bx, by, d, strike = self.bx[idx], self.by[idx], self.dir[idx], self.strike[idx]
        nx, ny = bx + _DX[d], by + _DY[d]
        side = (nx < 0) | (nx > 9)
        nx = np.clip(nx, 0, 9)
        d = np.where(side, _FLIP_X[d], d)
        top = ny < 0
        ny = np.where(top, 0, ny)
        d = np.where(top, _FLIP_Y[d], d)
        bricks = self.bricks[idx]
        r = np.arange(m)
        brick = ~top & bricks[r, ny, nx]
        hit = brick & ~strike & live
        bricks[r[hit], ny[hit], nx[hit]] = False
        ny = np.where(hit, by, ny)
        d = np.where(hit, _FLIP_Y[d], d)
        bottom = ~top & ~brick & (ny == 9) & live
        terminal = np.zeros(m, bool)
        if bottom.any():
            empty = bottom & ~bricks.reshape(m, 100).any(1)
            bricks[empty, 1:4, :] = True
            back = bottom & (bx == pos)
            edge = bottom & ~back & (nx == pos)
            terminal = bottom & ~back & ~edge
            d = np.where(back, _FLIP_Y[d], np.where(edge, _PADDLE_EDGE[d], d))
            ny = np.where(back | edge, by, ny)
        self._new_terminal = terminal
        # a brick cell entered while striking keeps the strike; anything else clears it
        strike = np.where(live, np.where(brick, strike | hit, False), strike)
        self.pos[idx] = pos
        self.lx[idx] = np.where(live, bx, self.lx[idx])
        self.ly[idx] = np.where(live, by, self.ly[idx])
        self.bx[idx] = np.where(live, nx, bx)
        self.by[idx] = np.where(live, ny, by)
        self.dir[idx] = np.where(live, d, self.dir[idx])
        self.strike[idx] = strike
        self.bricks[idx] = bricks
        return hit.astype(np.int64)

    def observe(self, idx):
        m = len(idx)
        r = np.arange(m)
        o = np.zeros((m, 4, 10, 10), np.float32)
        o[r, 0, 9, self.pos[idx]] = 1
        o[r, 1, self.by[idx], self.bx[idx]] = 1
        o[r, 2, self.ly[idx], self.lx[idx]] = 1
        o[:, 3] = self.bricks[idx]
        return o


# SpaceInvaders: the columns searched for the alien that shoots, nearest to the cannon first (MinAtar's stable sort)
_SEARCH = np.array([sorted(range(10), key=lambda x, p=p: abs(x - p)) for p in range(10)])
_SHOT_COOL_DOWN, _ENEMY_MOVE_INTERVAL, _ENEMY_SHOT_INTERVAL = 5, 12, 10


class SpaceInvaders(GamePort):
    channels = 6  # cannon, alien, alien_left, alien_right, friendly_bullet, enemy_bullet

    def __init__(self, n: int, width: int):
        super().__init__(n, width)
        self.pos = np.zeros(n, np.int64)
        self.f = np.zeros((n, 10, 10), bool)
        self.e = np.zeros((n, 10, 10), bool)
        self.alien = np.zeros((n, 10, 10), bool)
        self.adir = np.zeros(n, np.int64)
        self.interval = np.zeros(n, np.int64)
        self.move_timer = np.zeros(n, np.int64)
        self.shot_timer_alien = np.zeros(n, np.int64)
        self.ramp_index = np.zeros(n, np.int64)
        self.shot_timer = np.zeros(n, np.int64)
        self.ramping = np.zeros(n, bool)

    def load_game(self, i: int, env) -> None:
        self.pos[i], self.adir[i], self.interval[i] = env.pos, env.alien_dir, env.enemy_move_interval
        self.move_timer[i], self.shot_timer_alien[i] = env.alien_move_timer, env.alien_shot_timer
        self.ramp_index[i], self.shot_timer[i], self.ramping[i] = env.ramp_index, env.shot_timer, bool(env.ramping)
        self.f[i], self.e[i], self.alien[i] = env.f_bullet_map != 0, env.e_bullet_map != 0, env.alien_map != 0

    def step_game(self, idx, a, live):
        m = len(idx)
        r = np.arange(m)
        pos, shot = self.pos[idx], self.shot_timer[idx]
        f, e, alien = self.f[idx], self.e[idx], self.alien[idx]
        fire = live & (a == F_) & (shot == 0)
        f[r[fire], 9, pos[fire]] = True
        shot = np.where(fire, _SHOT_COOL_DOWN, shot)
        pos = np.where(live & ~fire & (a == L_), np.maximum(pos - 1, 0), pos)
        pos = np.where(live & ~fire & (a == R_), np.minimum(pos + 1, 9), pos)
        lv = live[:, None, None]
        # bullets: friendly up one row, enemy down one row (np.roll, then the wrapped row cleared)
        f = np.where(lv, np.concatenate([f[:, 1:], np.zeros((m, 1, 10), bool)], 1), f)
        e = np.where(lv, np.concatenate([np.zeros((m, 1, 10), bool), e[:, :-1]], 1), e)
        terminal = e[r, 9, pos] | alien[r, 9, pos]
        # aliens
        mt, adir, interval = self.move_timer[idx], self.adir[idx], self.interval[idx]
        move = live & (mt == 0)
        if move.any():
            count = alien.reshape(m, 100).sum(1)
            mt = np.where(move, np.minimum(count, interval), mt)
            down = move & ((alien[:, :, 0].any(1) & (adir < 0)) | (alien[:, :, 9].any(1) & (adir > 0)))
            terminal |= down & alien[:, 9, :].any(1)
            side = move & ~down
            moved = np.where(down[:, None, None], np.roll(alien, 1, axis=1), alien)
            moved = np.where((side & (adir < 0))[:, None, None], np.roll(alien, -1, axis=2), moved)
            alien = np.where((side & (adir > 0))[:, None, None], np.roll(alien, 1, axis=2), moved)
            adir = np.where(down, -adir, adir)
            terminal |= move & alien[r, 9, pos]
        ast = self.shot_timer_alien[idx]
        shoots = live & (ast == 0)
        if shoots.any():
            ast = np.where(shoots, _ENEMY_SHOT_INTERVAL, ast)
            s = np.flatnonzero(shoots)
            cols = alien[s].any(1)  # (k, 10): columns holding an alien
            order = _SEARCH[pos[s]]
            col = order[np.arange(len(s)), cols[np.arange(len(s))[:, None], order].argmax(1)]
            rows = 9 - alien[s, ::-1, col].argmax(1)  # the lowest alien of that column
            e[s, rows, col] = True
        kill = alien & f & lv
        reward = kill.reshape(m, 100).sum(1)
        alien &= ~kill
        f &= ~kill
        shot = np.where(live, shot - (shot > 0), shot)
        mt = np.where(live, mt - 1, mt)
        ast = np.where(live, ast - 1, ast)
        cleared = live & ~alien.reshape(m, 100).any(1)
        ramp = self.ramp_index[idx]
        if cleared.any():
            up = cleared & (interval > 6) & self.ramping[idx]
            interval = np.where(up, interval - 1, interval)
            ramp = np.where(up, ramp + 1, ramp)
            alien[cleared, 0:4, 2:8] = True
        self._new_terminal = terminal & live
        self.pos[idx], self.shot_timer[idx], self.f[idx], self.e[idx], self.alien[idx] = pos, shot, f, e, alien
        self.move_timer[idx], self.adir[idx], self.interval[idx] = mt, adir, interval
        self.shot_timer_alien[idx], self.ramp_index[idx] = ast, ramp
        return reward

    def observe(self, idx):
        m = len(idx)
        o = np.zeros((m, 6, 10, 10), np.float32)
        o[np.arange(m), 0, 9, self.pos[idx]] = 1
        alien = self.alien[idx]
        left = (self.adir[idx] < 0)[:, None, None]
        o[:, 1] = alien
        o[:, 2] = alien & left
        o[:, 3] = alien & ~left
        o[:, 4] = self.f[idx]
        o[:, 5] = self.e[idx]
        return o


_PLAYER_SPEED = 3


class Freeway(GamePort):
    channels = 7  # chicken, car, speed1..speed5 (the trail behind a car, by its speed)

    def __init__(self, n: int, width: int):
        super().__init__(n, width)
        self.pos = np.zeros(n, np.int64)
        self.move_timer = np.zeros(n, np.int64)
        self.time_left = np.zeros(n, np.int64)
        self.cx = np.zeros((n, 8), np.int64)  # car i drives on row i + 1
        self.ctimer = np.zeros((n, 8), np.int64)
        self.cspeed = np.zeros((n, 8), np.int64)

    def load_game(self, i: int, env) -> None:
        self.pos[i], self.move_timer[i], self.time_left[i] = env.pos, env.move_timer, env.terminate_timer
        for k, (x, y, timer, speed) in enumerate(env.cars):
            assert y == k + 1
            self.cx[i, k], self.ctimer[i, k], self.cspeed[i, k] = x, timer, speed

    def step_game(self, idx, a, live):
        m = len(idx)
        r = np.arange(m)
        pos, mt = self.pos[idx], self.move_timer[idx]
        up = live & (a == U_) & (mt == 0)
        down = live & ~up & (a == D_) & (mt == 0)
        mt = np.where(up | down, _PLAYER_SPEED, mt)
        pos = np.where(up, np.maximum(pos - 1, 0), np.where(down, np.minimum(pos + 1, 9), pos))
        win = live & (pos == 0)
        ctimer, cspeed = self.ctimer[idx], self.cspeed[idx]
        for k in np.flatnonzero(win):  # MinAtar's _randomize_cars(initialize=False), from the row's RandomState
            rs, shared = self.game_random(idx[k])
            speeds = rs.randint(1, 6, 8)
            speeds *= np.sign(rs.rand(8) - 0.5).astype(int)
            if shared:
                self._draw_ahead(idx[k])
            ctimer[k], cspeed[k] = np.abs(speeds), speeds
        pos = np.where(win, 9, pos)
        # only the car on the chicken's row can hit it (a hit sends it to row 9, where no car drives)
        cx = self.cx[idx]
        lane = np.clip(pos - 1, 0, 7)
        on_road = (pos >= 1) & (pos <= 8)
        hit = on_road & (cx[r, lane] == 4)
        moving = (ctimer == 0) & live[:, None]
        nx = (cx + np.where(cspeed > 0, 1, -1)) % 10
        cx = np.where(moving, nx, cx)
        hit |= on_road & moving[r, lane] & (cx[r, lane] == 4)
        ctimer = np.where(live[:, None], np.where(moving, np.abs(cspeed), ctimer - 1), ctimer)
        pos = np.where(live & hit, 9, pos)
        mt = np.where(live, mt - (mt > 0), mt)
        left = np.where(live, self.time_left[idx] - 1, self.time_left[idx])
        self._new_terminal = left < 0
        self.pos[idx], self.move_timer[idx], self.time_left[idx] = pos, mt, left
        self.cx[idx], self.ctimer[idx], self.cspeed[idx] = cx, ctimer, cspeed
        return win.astype(np.int64)

    def observe(self, idx):
        m = len(idx)
        r = np.arange(m)[:, None]
        o = np.zeros((m, 7, 10, 10), np.float32)
        o[np.arange(m), 0, self.pos[idx], 4] = 1
        cx, speed = self.cx[idx], self.cspeed[idx]
        rows = np.arange(1, 9)[None, :]
        o[r, 1, rows, cx] = 1
        back = np.where(speed > 0, cx - 1, cx + 1) % 10
        o[r, 1 + np.abs(speed), rows, back] = 1
        return o


PORTS = {"breakout": Breakout, "space_invaders": SpaceInvaders, "freeway": Freeway}


def port_name(core) -> Optional[str]:
    """The port that plays `core` (a `MinAtarEnv`) exactly, or None: only MinAtar's own game classes, with only the
    parameters a port knows (sticky actions, difficulty ramping, the permutations; the no-reward cutoff is the vector
    env's), through `MinAtarEnv`'s own act and observation."""
    if type(core).act is not MinAtarEnv.act or type(core).write_obs is not MinAtarEnv.write_obs:
        return None
    if set(MINATAR_PARAMETERS) - {"sticky_action_prob", "difficulty_ramping", "permute_obs", "permute_actions",
                                  "no_reward_cutoff"}:
        return None
    env = core.game.env
    name = type(env).__module__.rsplit(".", 1)[-1]
    if name not in PORTS or type(env).__module__ != f"minatar.environments.{name}":
        return None
    return name
