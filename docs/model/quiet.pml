/*
 * The quiet election of one key, as a model for spin (docs/model/README.md).
 *
 * N candidates, each a session that campaigns for the key:
 *   - a watcher polls: it takes the key when it is free, else a free heir
 *     slot, which makes it an heir;
 *   - an heir queues on the key; its wait ends by itself now and then
 *     (lock_timeout) and it queues again at the back, and a grant can race
 *     that timeout (the session then holds the key: it is adopted);
 *   - the server grants a released key to the first heir queued, in the
 *     same step as the release;
 *   - a leader may resign (to any candidate, or to one it names: a
 *     reservation that makes any other winner give the key back, for a
 *     bounded time), after which it cools down before it campaigns again;
 *     a resign that leaves the key free announces a vacancy, which
 *     watchers may miss (a notification is a hint; polls happen anyway);
 *   - any session may end at any time (a crash, a terminated backend, a
 *     new leader whose first renew failed): the server frees its key, its
 *     slot and its place in the queue, and the candidate comes back as a
 *     watcher; at most MAXCRASH times each, so that runs end.
 *
 * Checked: at most one candidate believes it leads, and only while the
 * server says it holds the key (assertions); and, under weak fairness,
 * that the key is always led again: [] <> (nlead > 0) (the LTL claim
 * below), whatever the crashes, resigns, reservations and lost
 * notifications.
 */

#ifndef N
#define N 3
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#define NONE 255
#define SLOTS 2

/* what the server knows */
byte holder = NONE;   /* the key's exclusive holder */
byte q[N];            /* heirs queued on the key, first is granted first */
byte qlen = 0;
byte slot[SLOTS];     /* heir slots: their holder, or NONE */
byte gate = NONE;     /* a reservation: the candidate it is for */

/* what the candidates believe */
bool leading[N];
byte nlead = 0;       /* how many candidates believe they lead */
bool vacancy[N];      /* a vacancy notification pending for a watcher */
byte crashes[N];

/* the candidate states */
mtype = { watcher, heir, leader, cooling };
mtype st[N];

/* The inlines use the calling process's locals m, k, s, n and c. */
inline dequeue_at(at) {
  m = at;
  do
  :: m + 1 < qlen -> q[m] = q[m + 1]; m++
  :: else -> break
  od;
  qlen--
}

/* remove candidate c from the queue, if it is there */
inline leave_queue(who) {
  k = 0;
  do
  :: k < qlen && q[k] == who -> dequeue_at(k); break
  :: k < qlen && q[k] != who -> k++
  :: k >= qlen -> break
  od
}

/* the key is released: the server grants it to the first heir queued */
inline release() {
  if
  :: qlen > 0 -> holder = q[0]; dequeue_at(0)
  :: else -> holder = NONE
  fi
}

inline free_slot(who) {
  s = 0;
  do
  :: s < SLOTS -> if :: slot[s] == who -> slot[s] = NONE :: else -> skip fi; s++
  :: else -> break
  od
}

inline check() {
  n = 0; c = 0;
  do
  :: c < N -> if :: leading[c] -> n++; assert(holder == c) :: else -> skip fi; c++
  :: else -> break
  od;
  assert(n <= 1 && n == nlead)
}

/* a candidate that finds it holds the key: it leads, unless a reservation
   for another candidate makes it give the key back */
inline won(i) {
  free_slot(i);
  if
  :: gate != NONE && gate != i -> release(); st[i] = watcher
  :: else -> leading[i] = true; nlead++; st[i] = leader;
             if :: gate == i -> gate = NONE :: else -> skip fi
  fi
}

proctype candidate(byte i) {
  byte m, k, s, n, c;
  st[i] = watcher;
  do
  /* a watcher's poll (due now and then, or at once after a vacancy) */
  :: atomic { st[i] == watcher ->
       vacancy[i] = false;
       if
       :: holder == NONE -> holder = i; won(i)
       :: holder != NONE && slot[0] == NONE -> slot[0] = i; q[qlen] = i; qlen++; st[i] = heir
       :: holder != NONE && slot[0] != NONE && slot[1] == NONE -> slot[1] = i; q[qlen] = i; qlen++; st[i] = heir
       :: else -> skip
       fi;
       check() }
  /* an heir's wait: granted ... */
  :: atomic { st[i] == heir && holder == i -> won(i); check() }
  /* ... or timed out, and queued again at the back (a grant that races
     the timeout leaves the key held: the next round adopts it, above) */
  :: atomic { st[i] == heir && holder != i ->
       leave_queue(i); q[qlen] = i; qlen++; check() }
  /* a leader resigns to any candidate */
  :: atomic { st[i] == leader ->
       leading[i] = false; nlead--; release();
       if
       :: holder == NONE -> c = 0;
          do
          :: c < N -> if :: st[c] == watcher -> vacancy[c] = true :: else -> skip fi; c++
          :: else -> break
          od
       :: else -> skip
       fi;
       st[i] = cooling; check() }
  /* a leader resigns to a named heir: the reservation, then the release */
  :: atomic { st[i] == leader && qlen > 0 ->
       if
       :: k = 0
       :: qlen > 1 -> k = qlen - 1
       fi;
       gate = q[k]; leading[i] = false; nlead--; release(); st[i] = cooling; check() }
  /* a lost notification: the watcher polls on its schedule instead */
  :: atomic { vacancy[i] -> vacancy[i] = false }
  /* cooling down ends */
  :: atomic { st[i] == cooling -> st[i] = watcher }
  /* the session ends: the server frees what it held */
  :: atomic { crashes[i] < MAXCRASH ->
       crashes[i]++;
       leave_queue(i); free_slot(i);
       if :: holder == i -> if :: leading[i] -> leading[i] = false; nlead-- :: else -> skip fi; release() :: else -> skip fi;
       st[i] = watcher; check() }
  od
}

/* A reservation binds for a bounded time: the clock ends it. */
proctype clock() {
  do
  :: atomic { gate != NONE -> gate = NONE }
  od
}

init {
  byte s = 0, c = 0;
  do
  :: s < SLOTS -> slot[s] = NONE; s++
  :: else -> break
  od;
  atomic {
    do
    :: c < N -> run candidate(c); c++
    :: else -> break
    od;
    run clock()
  }
}

/* The key is always led again: some candidate believes it leads (and
   the assertions say the server agrees). */
ltl releads { [] <> (nlead > 0) }
