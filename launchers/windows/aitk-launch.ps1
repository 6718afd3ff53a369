# aitk launcher body for Windows (called by aitk.bat): `manager update --auto`, then
# `manager launch`, with output shown and appended to logs\launcher.log in the checkout.
# Exit code: the launch's; 1 when no Python 3.10+ is found.
$ErrorActionPreference = 'Continue'
$root = (Resolve-Path (Join-Path $PSScriptRoot '..\..')).Path
Set-Location -LiteralPath $root
$logs = Join-Path $root 'logs'
New-Item -ItemType Directory -Force -Path $logs | Out-Null
$log = Join-Path $logs 'launcher.log'

function Find-Python {
    # The py launcher first (it knows every installed version), then python/python3.
    $candidates = @(@('py', '-3'), @('python'), @('python3'))
    foreach ($candidate in $candidates) {
        $exe = Get-Command $candidate[0] -ErrorAction SilentlyContinue
        if (-not $exe) { continue }
        $rest = @($candidate | Select-Object -Skip 1)
        & $exe.Source @rest -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>$null
        if ($LASTEXITCODE -eq 0) { return ,(@($exe.Source) + $rest) }
    }
    return $null
}

function Invoke-Logged([string[]] $Command) {
    Add-Content -LiteralPath $log -Value ("`n== {0}  {1}" -f (Get-Date -Format s), ($Command -join ' '))
    $exe = $Command[0]
    $rest = @($Command | Select-Object -Skip 1)
    # "$_" turns stderr lines back into plain text (PowerShell wraps them as errors);
    # Out-Host keeps the output out of this function's return value.
    & $exe @rest 2>&1 | ForEach-Object { "$_" } | Tee-Object -FilePath $log -Append | Out-Host
    return $LASTEXITCODE
}

$python = Find-Python
if (-not $python) {
    $message = "aitk: no Python 3.10 or newer found: install it from python.org, then run the launcher again"
    Write-Host $message
    Add-Content -LiteralPath $log -Value $message
    exit 1
}
$update = Invoke-Logged ($python + @('-m', 'manager', 'update', '--auto'))
if ($update -ne 0) {
    Write-Host "aitk: update failed (exit $update); starting the version already installed"
}
$code = Invoke-Logged ($python + @('-m', 'manager', 'launch'))
if ($update -ne 0 -and $code -eq 0) { $code = $update }
exit $code
