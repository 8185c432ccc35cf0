# zsh -f tests/complete.zsh SCRIPT LINE: the matches zsh's own completion offers for LINE<TAB>, one a line.
# An interactive zsh on a pseudo-terminal (zpty) loads compinit and SCRIPT, is typed LINE and a TAB, and prints
# every match as compadd takes it (a wrapper around the builtin), up to a mark its completion prints when done.
# The marks are written in two pieces, so that the terminal's echo of these lines never matches them.
zmodload zsh/zpty
zmodload zsh/datetime
zpty z zsh -f -i
zpty -w z "PS1= PS2= ; autoload -U compinit; compinit -u -D"
zpty -w z "source ${(q)1}"
zpty -w z 'compadd() { local -a __m; if (( ${@[(I)-[OAD]]} )); then builtin compadd "$@"; return; fi; builtin compadd -A __m "$@"; (( $#__m )) && print -rl -- ">"">>"${^__m}; builtin compadd "$@"; }'
zpty -w z '__done() { print -r -- "<<<""DONE"; }; comppostfuncs=(__done)'
zpty -w z "zstyle ':completion:*' list-grouped false; bindkey '^I' complete-word"
zpty -w -n z "$2"$'\t'
local line
integer done=0
local -F deadline=$(( EPOCHREALTIME + 15 ))
while (( EPOCHREALTIME < deadline )); do
  if ! zpty -r -t z line; then sleep 0.05; continue; fi
  [[ -n $DEBUG ]] && print -r -- "RAW: ${(q+)line}" >&2
  [[ $line == *'<<<DONE'* ]] && { done=1; break; }
  [[ $line == *'>>>'* ]] && print -r -- "${${line##*>>>}%%[$'\r\n']*}"
done
zpty -d z
(( done )) || { print -u2 "complete.zsh: completion did not finish"; exit 3; }
