# gpurent: build, test and run the control plane (gpurentd) and the node agent
# (gpurent-agent). Plain make, libraries found with pkg-config.
#
#   make            build both programs into build/
#   make run        install missing Debian packages, build, start a local system
#   make check      install missing packages, build with ASan+UBSan, run every test
#   make install    PREFIX=/usr/local DESTDIR=
#   make clean

PREFIX   ?= /usr/local
# Debian's interpreter, where python3-pytest and python3-requests install; a
# python3 earlier on PATH (pyenv, a virtualenv) would not have them.
PYTHON   ?= /usr/bin/python3
DESTDIR  ?=
CC       ?= cc
# make check compiles with a job per core; the tests then run one at a time.
JOBS     ?= $(shell nproc 2>/dev/null || echo 1)
# gnutls: libmicrohttpd's TLS, whose record reads the request guard
# interposes (src/common/http_guard.c).
PKGS     := libmicrohttpd gnutls jansson libcurl sqlite3 openssl inih libsystemd libssh
WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wpointer-arith -Wformat=2 -Wcast-qual -Wvla -Wundef -Wwrite-strings \
            -Wno-unused-parameter
CFLAGS   ?= -O2 -g
# Every layer's folder is on the include path for now; check-layers (below)
# is what keeps each file to the headers its layer may use.
INCLUDES := -Iinclude -Isrc/gpurentd
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(INCLUDES) -I$(B)/gen \
             $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# wslay (the web terminal's WebSocket framing): Debian's libwslay-dev ships
# no pkg-config file, so it is named here.
LIBS     := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lwslay -lpthread -lm

# SAN=1 builds everything with AddressSanitizer and UndefinedBehaviorSanitizer
# into build/san, so the sanitized and plain builds never mix objects.
ifeq ($(FUZZ),1)
# FUZZ=1 (make fuzz): clang, with libFuzzer's coverage and ASan + UBSan,
# into build/fuzz. Warnings stay warnings: clang's differ from gcc's, and
# the gcc builds are the ones make check holds to -Werror.
B        := build/fuzz
CC       := clang
WARN     := $(filter-out -Werror,$(WARN))
CFLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
LDFLAGS  += -fsanitize=address,undefined
else ifeq ($(SAN),1)
B        := build/san
CFLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
LDFLAGS  += -fsanitize=address,undefined
else
B        := build
endif

COMMON_SRC := $(wildcard src/common/*.c)
DAEMON_SRC := $(filter-out src/gpurentd/cmd/main.c,$(wildcard src/gpurentd/*/*.c))
AGENT_SRC  := $(filter-out src/agent/main.c,$(wildcard src/agent/*.c src/agent/*/*.c))
GATEWAY_SRC := $(filter-out src/gateway/main.c,$(wildcard src/gateway/*.c))
UNIT_SRC   := $(wildcard tests/unit/*/test_*.c)
MIGRATIONS := $(sort $(wildcard migrations/*.sql))

COMMON_OBJ := $(COMMON_SRC:%.c=$(B)/%.o)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(B)/%.o) $(B)/gen/embedded.o
AGENT_OBJ  := $(AGENT_SRC:%.c=$(B)/%.o)
GATEWAY_OBJ := $(GATEWAY_SRC:%.c=$(B)/%.o)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/%)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(B)/fuzz-replay/fuzz_%)

.PHONY: all deps run stop check check-layers lint-openapi format unit unit-programs e2e check-fast install clean
all: $(B)/gpurentd $(B)/gpurent-agent $(B)/gpurent-gateway console-vendor
gateway: $(B)/gpurent-gateway

# The web console's npm libraries, copied from node_modules (npm ci, by
# scripts/deps.sh) into the directory gpurentd serves: xterm.js for the web
# terminal. Without node_modules the console works except its terminal page,
# which says so; make says it too.
CONSOLE_VENDOR := console/vendor/xterm/xterm.mjs console/vendor/xterm/xterm.css console/vendor/xterm/LICENSE
.PHONY: console-vendor screenshots
console-vendor:
	@if [ -f node_modules/@xterm/xterm/lib/xterm.mjs ]; then $(MAKE) --no-print-directory $(CONSOLE_VENDOR); \
	else echo "console: node_modules/@xterm/xterm is missing (scripts/deps.sh test runs npm ci): the web terminal page will not work"; fi
console/vendor/xterm/xterm.mjs: node_modules/@xterm/xterm/lib/xterm.mjs
	@mkdir -p $(dir $@); cp $< $@
console/vendor/xterm/xterm.css: node_modules/@xterm/xterm/css/xterm.css
	@mkdir -p $(dir $@); cp $< $@
console/vendor/xterm/LICENSE: node_modules/@xterm/xterm/LICENSE
	@mkdir -p $(dir $@); cp $< $@

# PNGs of the main pages (Chinese and English, 1366 and 390 pixels wide)
# into docs/screenshots/, from a throw-away gpurentd with a sim fleet,
# through headless Chromium (tests/e2e/console/screenshots.py).
screenshots: all
	GPURENTD=$(CURDIR)/$(B)/gpurentd GPURENT_AGENT=$(CURDIR)/$(B)/gpurent-agent \
	  $(PYTHON) tests/e2e/console/screenshots.py docs/screenshots

deps:
	@scripts/deps.sh build

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

# The agent's own objects see include/ and src/agent only: an agent file that
# names a daemon header does not compile, and a header in one of the agent's
# folders is named with it ("discovery/discovery.h").
$(B)/src/agent/%.o: INCLUDES := -Iinclude -Isrc/agent
# The gateway (issue 17) sees include/ and its own folder only, as the agent.
$(B)/src/gateway/%.o: INCLUDES := -Iinclude -Isrc/gateway

# Migrations and the OpenAPI document are compiled into the daemon, so an
# installed binary needs no source tree to migrate or describe itself.
$(B)/gen/embedded.c: scripts/embed.sh $(MIGRATIONS) docs/openapi.json
	@mkdir -p $(dir $@)
	scripts/embed.sh docs/openapi.json $(MIGRATIONS) > $@.tmp && mv $@.tmp $@

$(B)/gen/embedded.o: $(B)/gen/embedded.c
	$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -c $< -o $@

$(B)/libcommon.a: $(COMMON_OBJ)
	@rm -f $@; ar rcs $@ $^
$(B)/libdaemon.a: $(DAEMON_OBJ)
	@rm -f $@; ar rcs $@ $^
$(B)/libagent.a: $(AGENT_OBJ)
	@rm -f $@; ar rcs $@ $^
# The gateway but its main(), so fuzz targets can link its parsers.
$(B)/libgateway.a: $(GATEWAY_OBJ)
	@rm -f $@; ar rcs $@ $^

$(B)/gpurentd: $(B)/src/gpurentd/cmd/main.o $(B)/libdaemon.a $(B)/libcommon.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/gpurent-agent: $(B)/src/agent/main.o $(B)/libagent.a $(B)/libcommon.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/gpurent-gateway: $(B)/src/gateway/main.o $(B)/libgateway.a $(B)/libcommon.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/tests/%: tests/unit/%.c $(B)/libdaemon.a $(B)/libagent.a $(B)/libgateway.a $(B)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Isrc/agent -Isrc/gateway -Wno-missing-prototypes $(LDFLAGS) -o $@ $^ $(LIBS) -lcmocka

# Unit tests run from the repository root so they can read tests/data.
unit-programs: $(UNIT_BIN) $(FUZZ_REPLAY)
unit: $(UNIT_BIN) $(FUZZ_REPLAY)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done
	@set -e; for n in $(FUZZ_NAMES); do $(B)/fuzz-replay/fuzz_$$n tests/fuzz/corpus/$$n; done

# Fuzz targets (tests/fuzz/fuzz_NAME.c, each a LLVMFuzzerTestOneInput over
# one parser of untrusted bytes). make check replays the inputs kept in
# tests/fuzz/corpus/NAME/ (seeds, and every input that once failed)
# through each on the sanitized build; make fuzz runs clang's libFuzzer on
# each for FUZZ_SECONDS, new inputs going to build/fuzz/corpus/NAME and
# failures to build/fuzz/failures/ (copy one into the kept corpus with the
# fix that makes it pass).
$(B)/fuzz-replay/%: tests/fuzz/%.c tests/fuzz/replay.c $(B)/libdaemon.a $(B)/libagent.a $(B)/libgateway.a $(B)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Isrc/agent -Isrc/gateway $(LDFLAGS) -o $@ $^ $(LIBS)
$(B)/fuzz-run/%: tests/fuzz/%.c $(B)/libdaemon.a $(B)/libagent.a $(B)/libgateway.a $(B)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Isrc/agent -Isrc/gateway $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LIBS)
FUZZ_SECONDS ?= 60
.PHONY: fuzz fuzz-programs
fuzz-programs: $(FUZZ_NAMES:%=$(B)/fuzz-run/fuzz_%)
fuzz:
	@command -v clang >/dev/null || { echo "make fuzz needs clang and libFuzzer: sudo apt-get install -y clang libclang-rt-14-dev" >&2; exit 1; }
	$(MAKE) FUZZ=1 -j$(JOBS) fuzz-programs
	@set -e; mkdir -p build/fuzz/failures; for n in $(or $(FUZZ_ONLY),$(FUZZ_NAMES)); do \
	  mkdir -p build/fuzz/corpus/$$n; echo "== fuzz_$$n, $(FUZZ_SECONDS) s"; \
	  build/fuzz/fuzz-run/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -artifact_prefix=build/fuzz/failures/$$n- build/fuzz/corpus/$$n tests/fuzz/corpus/$$n; done

# PYTEST_ARGS naming test paths (tests/...) runs only those; otherwise all,
# in E2E_WORKERS processes (pytest-xdist), each taking whole files: the
# tests mostly wait on daemons and fleets (one process keeps about 0.6 of
# the two cores busy), so two at once take little more than half the time.
E2E_WORKERS ?= 2
e2e: all
	GPURENTD=$(CURDIR)/$(B)/gpurentd GPURENT_AGENT=$(CURDIR)/$(B)/gpurent-agent \
	  $(PYTHON) -m pytest -q -p no:cacheprovider $(if $(filter tests/%,$(PYTEST_ARGS)),,tests/e2e \
	  $(if $(filter-out 1,$(E2E_WORKERS)),-n $(E2E_WORKERS) --dist loadfile)) $(PYTEST_ARGS)

# The whole suite runs once, on the sanitized build: every test is also a
# memory-safety and undefined-behaviour test. The plain build is compiled too
# so a warning that only -O2 finds still fails the check.
check:
	@scripts/deps.sh test
	$(MAKE) check-layers
	$(MAKE) lint-openapi
	$(MAKE) -j$(JOBS) all
	$(MAKE) SAN=1 -j$(JOBS) all unit-programs
	ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(MAKE) SAN=1 unit e2e

# Each layer includes only what it may (scripts/check-layers.py says what).
check-layers:
	$(PYTHON) scripts/check-layers.py

# The API description passes two independent OpenAPI linters with no
# errors: Spectral's spectral:oas rules (.spectral.yaml) and Redocly's
# recommended ones (redocly.yaml), the npm packages package.json pins and
# scripts/deps.sh installs into node_modules with npm ci. Part of make check.
lint-openapi:
	node_modules/.bin/spectral lint --ruleset .spectral.yaml --fail-severity error --display-only-failures \
	  docs/openapi.json
	node_modules/.bin/redocly lint --config redocly.yaml --format stylish docs/openapi.json

check-fast: check-layers lint-openapi all unit e2e

# Applies .clang-format (Debian's clang-format) to the C sources and headers.
# Not tests/unit: cmocka's header needs the includes it comes after, which
# sorting would move.
FORMATTED = $(shell find src include bench -name '*.[ch]' 2>/dev/null)
format:
	@command -v clang-format >/dev/null || { echo "make format needs clang-format: apt-get install -y clang-format"; exit 1; }
	clang-format -i $(FORMATTED)

run:
	@scripts/deps.sh build
	$(MAKE) all
	scripts/run-local.sh

# make stop: stops a make run from another terminal (the one using the same
# GPURENT_VAR), as Ctrl-C in its own terminal does.
stop:
	@scripts/run-local.sh stop

# make install [PREFIX=/usr/local] [DESTDIR=]: the two binaries in
# $(PREFIX)/bin; the systemd units in $(PREFIX)/lib/systemd/system and the
# gpurent user's sysusers.d entry in $(PREFIX)/lib/sysusers.d (systemd reads
# both for PREFIX /usr/local and /usr; for another PREFIX add
# UNITDIR=/etc/systemd/system SYSUSERSDIR=/etc/sysusers.d); the documents in
# $(PREFIX)/share/doc/gpurent; the configuration in /etc/gpurent, where a
# file already there and changed is kept and the new default goes beside it
# as FILE.new; gpurentd.conf, which may hold secrets, is 0640 and (on the
# real system) of group gpurent. The units are rewritten to name $(PREFIX)/bin. Only on the
# real system (no DESTDIR) is the gpurent user created, if missing, and
# systemd told to reload its units.
install: all
	@set -e; \
	bindir='$(DESTDIR)$(PREFIX)/bin'; \
	unitdir='$(DESTDIR)$(or $(UNITDIR),$(PREFIX)/lib/systemd/system)'; \
	sysusersdir='$(DESTDIR)$(or $(SYSUSERSDIR),$(PREFIX)/lib/sysusers.d)'; \
	docdir='$(DESTDIR)$(PREFIX)/share/doc/gpurent'; \
	consoledir='$(DESTDIR)$(PREFIX)/share/gpurent/console'; \
	confdir='$(DESTDIR)/etc/gpurent'; \
	install -d "$$bindir" "$$unitdir" "$$sysusersdir" "$$docdir" "$$confdir"; \
	install -m 0755 $(B)/gpurentd $(B)/gpurent-agent $(B)/gpurent-gateway "$$bindir/"; \
	for u in gpurentd.service gpurent-agent.service gpurent-gateway.service; do \
	  sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|g' \
	      -e 's|/usr/local/share/doc/gpurent/|$(PREFIX)/share/doc/gpurent/|g' conf/$$u > "$$unitdir/$$u.tmp"; \
	  chmod 0644 "$$unitdir/$$u.tmp"; mv -f "$$unitdir/$$u.tmp" "$$unitdir/$$u"; \
	done; \
	install -m 0644 conf/gpurent.sysusers "$$sysusersdir/gpurent.conf"; \
	rm -rf "$$consoledir"; install -d "$$consoledir"; cp -R console/. "$$consoledir/"; \
	find "$$consoledir" -type d -exec chmod 0755 {} +; find "$$consoledir" -type f -exec chmod 0644 {} +; \
	install -m 0644 README.md docs/OPERATIONS.md docs/REPORTS.md docs/ARCHITECTURE.md \
	  docs/AGENT_PROTOCOL.md "$$docdir/"; \
	for c in gpurentd.conf gpurent-agent.conf; do \
	  mode=0644; [ $$c = gpurentd.conf ] && mode=0640; \
	  tmp="$$confdir/.$$c.install"; \
	  sed -e 's|^console_dir = /usr/local/share/gpurent/console$$|console_dir = $(PREFIX)/share/gpurent/console|' \
	    conf/$$c > "$$tmp"; \
	  if [ -e "$$confdir/$$c" ] && ! cmp -s "$$tmp" "$$confdir/$$c"; then \
	    install -m $$mode "$$tmp" "$$confdir/$$c.new"; \
	    echo "install: kept $$confdir/$$c; the new default is $$c.new beside it"; \
	  else \
	    install -m $$mode "$$tmp" "$$confdir/$$c"; \
	  fi; \
	  rm -f "$$tmp"; \
	done; \
	if [ -z '$(DESTDIR)' ]; then \
	  if ! getent passwd gpurent >/dev/null; then \
	    if command -v systemd-sysusers >/dev/null; then \
	      systemd-sysusers "$$sysusersdir/gpurent.conf"; \
	    else \
	      useradd --system --user-group --home-dir /var/lib/gpurent --no-create-home \
	        --shell /usr/sbin/nologin --comment 'gpurent control plane' gpurent; \
	    fi; \
	    echo "install: created the system user gpurent"; \
	  fi; \
	  chgrp gpurent "$$confdir/gpurentd.conf"; \
	  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi; \
	  echo "install: done; start with: systemctl enable --now gpurentd (docs/OPERATIONS.md)"; \
	fi

clean:
	rm -rf build var

-include $(shell find build -name '*.d' 2>/dev/null)

# bench: a billing pass over 10 000 and 100 000 running instances (time and
# memory); figures and how to read them are in BENCHMARKS.md.
.PHONY: bench
$(B)/bench/%: bench/%.c bench/bench_util.c bench/bench_util.h $(B)/libdaemon.a $(B)/libcommon.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Ibench -Isrc/agent $(LDFLAGS) -o $@ $(filter %.c %.a,$^) $(LIBS)
# make bench (issue 15): every benchmark, bounded, on loopback, with its
# reference in the same run (nginx serving the same bytes for the HTTP
# reads, plain SQLite's durable transaction for writes, the in-process claim
# for creates, nginx's own start for start-up, the rate the period asks for
# heartbeats); the rows go into BENCHMARKS.md (bench/table.py). Installs its
# packages (deps.sh bench).
$(B)/bench/sqlite_txn: bench/sqlite_txn.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< -lsqlite3
bench: all $(B)/bench/billing $(B)/bench/claims $(B)/bench/sqlite_txn
	scripts/deps.sh bench
	@mkdir -p $(B)/bench/out && rm -f $(B)/bench/out/*
	$(B)/bench/sqlite_txn --seconds 5 > $(B)/bench/out/1-sqlite.out
	timeout 1200 python3 bench/reads.py --nodes 100 1000 10000 --seconds 10 > $(B)/bench/out/2-reads.out
	timeout 300 $(B)/bench/claims --nodes 100 --threads 1,4,16 > $(B)/bench/out/3-claims.out
	timeout 300 $(B)/bench/claims --nodes 10000 --threads 1,4,16 >> $(B)/bench/out/3-claims.out
	timeout 300 $(B)/bench/billing --instances 10000 > $(B)/bench/out/4-billing.out
	timeout 300 $(B)/bench/billing --instances 100000 >> $(B)/bench/out/4-billing.out
	timeout 600 $(B)/bench/billing --instances 100000 --shuffled-ids >> $(B)/bench/out/4-billing.out
	timeout 900 python3 bench/instances.py --nodes 1000 --live 3000 --seconds 2 --reference > $(B)/bench/out/5-creates.out
	timeout 900 python3 bench/instances.py --nodes 10000 --live 10000 --seconds 3 --reference --background 30 >> $(B)/bench/out/5-creates.out
	timeout 900 python3 bench/instances.py --nodes 1000 --live 4000 --seconds 1 --clients 64 --reference >> $(B)/bench/out/5-creates.out
	timeout 900 python3 bench/instances.py --nodes 10000 --live 10000 --seconds 3 --clients 64 --reference --background 30 >> $(B)/bench/out/5-creates.out
	timeout 300 python3 bench/startup.py --postings 1000000 > $(B)/bench/out/6-startup.out
	timeout 900 python3 bench/heartbeat.py --nodes 10000 --seconds 30 > $(B)/bench/out/7-heartbeat.out
	python3 bench/table.py BENCHMARKS.md $(B)/bench/out/*.out
