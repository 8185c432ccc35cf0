# Shell helpers shared by the simulated host's daemons and clusters (sourced, never run): messages, processes
# started and stopped by their pid files, mounts a killed daemon left, Debian packages installed when missing,
# the debootstrap root file system that every sandboxed daemon imports as its base image, and the newer
# engines' binaries unpacked from Debian 13's and sid's packages.
# The sourcing script sets SAY_AS (the name its messages start with) and REPO (the checkout) first.

CACHE=${GPUPIN_CACHE:-/var/cache/gpupin}
ROOTFS_TAR=$CACHE/rootfs-bookworm-minbase-python3.tar

say() { printf '%s: %s\n' "$SAY_AS" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$SAY_AS" "$*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ensure_packages() {
    # Each argument is PACKAGE or PACKAGE:PATH (installed when PATH is not executable, else when the command
    # named PACKAGE is missing).
    # One install at a time on this machine: apt's lists lock is not waited for by `apt-get update` here (two
    # engines' sandboxes coming up side by side on a fresh machine failed on it), and a package the other one
    # installed meanwhile is not installed twice.
    mkdir -p "$CACHE" && chmod 0755 "$CACHE"
    exec 6>"$CACHE/.apt.lock"
    flock 6
    local need=() spec pkg path
    for spec in "$@"; do
        pkg=${spec%%:*}; path=${spec#*:}
        if [ "$path" != "$spec" ]; then [ -x "$path" ] || need+=("$pkg")
        else command -v "$pkg" >/dev/null || need+=("$pkg"); fi
    done
    [ ${#need[@]} = 0 ] && { exec 6>&-; return 0; }
    say "installing ${need[*]}"
    # Keep the packages' init scripts from starting system daemons: those are never ours to touch.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    # apt waits for dpkg's lock (unattended-upgrades may hold it).
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
    [ "$made_policy" = 1 ] && rm -f "$policy"
    exec 6>&-
    return 0
}

unmount_under() {
    # Mounts a killed daemon left behind (overlay, shm, netns), deepest first.
    local dir
    for dir in "$@"; do
        awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done
    done
}

stop_pid() {
    local pidfile=$1 name=$2 pid i
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then say "$name ($pid) did not stop in 20 s; killing it"; kill -KILL "$pid"; fi
    rm -f "$pidfile"
}

debian_mirror() {
    # The Debian archive the root file system and Engine 26 come from: DEBOOTSTRAP_MIRROR, else this machine's own,
    # as apt itself reads its sources (sources.list and sources.list.d's one-line .list and deb822 .sources files):
    # the first `deb` entry for the main component of a release proper (no -updates, -security, -backports).
    if [ -n "${DEBOOTSTRAP_MIRROR:-}" ]; then echo "$DEBOOTSTRAP_MIRROR"; return 0; fi
    local uri
    # shellcheck disable=SC2016  # $(...) here are apt's format fields, not the shell's
    uri=$(apt-get -o DPkg::Lock::Timeout=600 indextargets --no-release-info --format '$(TARGET_OF) $(COMPONENT) $(RELEASE) $(SITE)' 2>/dev/null |
        awk '$1 == "deb" && $2 == "main" && $3 !~ /[-\/]/ && $4 ~ /^(https?|file):\/\// {print $4; exit}')
    [ -n "$uri" ] || die "no Debian archive (a deb line for the main component) in this machine's apt sources \
(/etc/apt/sources.list, /etc/apt/sources.list.d). HINT: set DEBOOTSTRAP_MIRROR to a Debian mirror's URL"
    echo "$uri"
}

wait_for() {
    local i
    for i in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    return 1
}

build_rootfs() {
    # One debootstrap for every sandbox and engine on this machine, kept as a tar (the image cache of a daemon
    # cannot be shared); the lock keeps two sandboxes from building it at once.
    debootstrap_tar bookworm python3,python3-pip,procps "$ROOTFS_TAR"
}

debootstrap_tar() {
    # debootstrap_tar SUITE INCLUDES TAR: a minbase root file system of SUITE with the packages INCLUDES (commas)
    # into TAR, built once per machine under the cache's lock.
    local suite=$1 include=$2 tar=$3
    [ -s "$tar" ] && return 0
    mkdir -p "$CACHE" && chmod 0755 "$CACHE"
    exec 8>"$CACHE/.build.lock"
    flock 8
    [ -s "$tar" ] && { exec 8>&-; return 0; }
    local mirror
    mirror=$(debian_mirror) || exit 1
    say "building a root file system with debootstrap ($suite, minbase, $include) from $mirror"
    local root=$CACHE/rootfs.tmp log=$CACHE/debootstrap-$suite.log
    rm -rf "$root"
    debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >"$log" 2>&1 \
        || die "debootstrap failed; see $log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tar.tmp" . && mv -f "$tar.tmp" "$tar"
    rm -rf "$root"
    exec 8>&-
}

# Engines from Debian's newer releases: dockerd, the docker CLI, containerd, the compose v2 plugin and tini, unpacked
# with `dpkg -x` into a private prefix of this checkout (build/engines/VERSION); nothing is installed over the
# system's packages. Their runc needs glibc 2.38 (bookworm has 2.36), so it is never fetched: the daemons find
# Debian 12's runc on their PATH. Engine 26 is Debian 13 (trixie)'s; Engine 28.5 is sid's.
# tini: docker-init (`docker run --init`) is its static build.
ENGINE_PACKAGES=(docker.io docker-cli containerd docker-compose tini)
# What the tests were written against; a point release keeps these, a newer series would need a look.
ENGINE26_VERSIONS=(docker.io:26.1. docker-cli:26.1. containerd:1.7. docker-compose:2.26.)
ENGINE28_5_VERSIONS=(docker.io:28.5. docker-cli:28.5. containerd:2.1. docker-compose:2.40.)
TRIXIE_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

engine_dir() { echo "$REPO/build/engines/$1"; }

fetch_engine() {
    # fetch_engine VERSION: Engine 26 from trixie, Engine 28.5 from sid, into build/engines/VERSION/root.
    local version=$1 suite versions dir root
    case "$version" in
        26) suite=trixie versions=("${ENGINE26_VERSIONS[@]}") ;;
        28.5) suite=sid versions=("${ENGINE28_5_VERSIONS[@]}") ;;
        *) die "no Debian release carries Engine $version here" ;;
    esac
    dir=$(engine_dir "$version") root=$(engine_dir "$version")/root
    local stamp=$dir/.unpacked
    [ -s "$stamp" ] && [ -x "$root/usr/sbin/dockerd" ] && return 0
    mkdir -p "$dir"
    exec 7>"$dir/.lock"
    flock 7
    if [ -s "$stamp" ] && [ -x "$root/usr/sbin/dockerd" ]; then exec 7>&-; return 0; fi
    local mirror
    mirror=$(debian_mirror) || exit 1
    say "fetching Engine $version (${ENGINE_PACKAGES[*]}) from Debian $suite at $mirror"
    # apt with private sources, lists, cache and preferences: the system's apt state is neither read nor changed.
    local apt=$REPO/build/engines/apt-$suite debs=$dir/debs
    rm -rf "$debs" && mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" \
        "$apt/preferences.d" "$debs"
    echo "deb [signed-by=$TRIXIE_KEYRING] $mirror $suite main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
                -o "Dir::Etc::preferences=/dev/null" -o "Dir::Etc::preferencesparts=$apt/preferences.d"
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "Dir::State::status=/dev/null"
                -o "APT::Sandbox::User=root" -qq)
    apt-get -o DPkg::Lock::Timeout=600 "${opts[@]}" update >"$apt/update.log" 2>&1 \
        || die "apt-get update of $suite failed (see $apt/update.log). HINT: $suite's archive keys come with a \
recent debian-archive-keyring (apt-get install debian-archive-keyring); DEBOOTSTRAP_MIRROR sets the mirror"
    (cd "$debs" && apt-get -o DPkg::Lock::Timeout=600 "${opts[@]}" download "${ENGINE_PACKAGES[@]}") \
        >"$apt/download.log" 2>&1 \
        || die "apt-get download ${ENGINE_PACKAGES[*]} from $suite failed; see $apt/download.log"
    local spec pkg want deb got
    for spec in "${versions[@]}"; do
        pkg=${spec%%:*} want=${spec#*:}
        deb=$(ls "$debs/${pkg}"_*.deb)
        got=$(dpkg-deb -f "$deb" Version)
        # Debian's versions may carry an epoch (5:28.5.2+dfsg3-1).
        case "${got#*:}" in "$want"*) ;; *) die "$suite's $pkg is $got, not the ${want}x these tests expect. \
HINT: check the Engine $version tests against it, then update its versions in tests/sandbox/common.sh" ;; esac
    done
    rm -rf "$root.tmp" && mkdir -p "$root.tmp"
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root.tmp"; done
    rm -rf "$root" && mv "$root.tmp" "$root"
    # The docker CLI finds CLI plugins (compose v2) only in fixed system folders or those its config names.
    mkdir -p "$dir/docker-config"
    printf '{"cliPluginsExtraDirs": ["%s"]}\n' "$root/usr/libexec/docker/cli-plugins" >"$dir/docker-config/config.json"
    (cd "$debs" && ls ./*.deb) >"$stamp"
    rm -rf "$debs"  # unpacked is what is kept
    exec 7>&-
}

ns_private_plugins() {
    # ns_private_plugins DIR, inside a daemon's own mount namespace (unshare -m --propagation private): drop the
    # copies of other daemons' container mounts (they would keep those layers and network namespaces alive here),
    # and make /run/docker/plugins, where dockerd finds its plugins (an authorization plugin's socket), DIR, so the
    # daemon serves its own plugins and the host's folder is neither read nor written. NS_HOLD: a folder of this
    # daemon's own for ns_cover.
    awk '$2 ~ "^/(run|var/lib)/" {print $2}' /proc/self/mounts | sort -r | while read -r m; do
        umount -n -l "$m" 2>/dev/null || true
    done
    NS_GRAFTED=
    ns_graft /run/docker/plugins
    mount -n --bind "$1" /run/docker/plugins
}

ns_graft() {
    # ns_graft DIR: DIR exists afterwards in this mount namespace while the host's file system gains nothing: the
    # nearest folder above it that exists becomes, here only, a tmpfs holding the same entries (each bound to the
    # host's own), and the missing folders are made in that tmpfs.
    local dir=$1 parent
    [ -d "$dir" ] && return 0
    parent=$(dirname "$dir")
    ns_graft "$parent"
    case " $NS_GRAFTED " in *" $parent "*) ;; *) ns_cover "$parent" ;; esac
    mkdir "$dir"
    NS_GRAFTED="$NS_GRAFTED $dir"
}

ns_cover() {
    local dir=$1 hold=$NS_HOLD entry name
    mkdir -p "$hold"
    # -n: mount(8) would record these in /run/mount/utab, the host's own once bound back
    mount -n --rbind "$dir" "$hold"
    mount -n -t tmpfs -o "mode=$(stat -c %a "$dir")" gpupin-sandbox "$dir"
    for entry in "$hold"/* "$hold"/.[!.]*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        name=$dir/${entry##*/}
        if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$name"
        elif [ -d "$entry" ]; then mkdir -p "$name" && mount -n --rbind "$entry" "$name"
        else : >"$name" && mount -n --bind "$entry" "$name"; fi
    done
    umount -n -R -l "$hold" && rmdir "$hold"
    NS_GRAFTED="$NS_GRAFTED $dir"
}
