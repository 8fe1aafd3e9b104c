<#
.SYNOPSIS
    Start HyperQwen with Docker Desktop (WSL2 backend), follow the server log, open the page, stop on exit.

.DESCRIPTION
    Runs `init` and `prepare` first and streams prepare's log (the first start downloads ~20 GB), then
    `docker compose --profile <Mode> [--profile webui] up -d` in the repository folder, shows the server's
    log, waits until the server's /health answers, then opens the chat WebUI (with -WebUI) or the monitor page
    in the default browser. LAN addresses are printed only when .env exposes the stack (BIND other than
    127.0.0.1). Ctrl+C or closing the window stops the stack (`docker compose down`; volumes are kept).
    When the start fails, the containers are only stopped (not removed) and their logs are saved to
    hyperqwen-start.log in the repository folder.
    Works in Windows PowerShell 5.1 and PowerShell 7: docker's stderr never meets $ErrorActionPreference.

.PARAMETER Mode
    single (one user, lowest latency) or batch (many concurrent requests).

.PARAMETER WebUI
    Also start the Open WebUI chat page (compose profile `webui`) and open it instead of the monitor.

.PARAMETER NoBrowser
    Do not open a browser page.

.PARAMETER TimeoutMinutes
    How long to wait for the server to become healthy. The first start compiles kernels and can take 20 min.

.EXAMPLE
    .\Start-HyperQwen.ps1 -Mode batch -WebUI
#>
[CmdletBinding()]
param(
    [ValidateSet('single', 'batch')]
    [string]$Mode = 'single',
    [switch]$WebUI,
    [switch]$NoBrowser,
    [ValidateRange(1, 240)]
    [int]$TimeoutMinutes = 25
)

Set-StrictMode -Version 3.0
$ErrorActionPreference = 'Stop'

$Repo = Split-Path -Parent $PSScriptRoot
Set-Location -LiteralPath $Repo

function Read-DotEnv([string]$Path) {
    # KEY=VALUE lines as compose reads them; comments and blank lines skipped, surrounding quotes removed.
    $values = @{}
    if (-not (Test-Path -LiteralPath $Path)) { return $values }
    foreach ($line in Get-Content -LiteralPath $Path) {
        $text = $line.Trim()
        if ($text -eq '' -or $text.StartsWith('#')) { continue }
        $pair = $text -split '=', 2
        if ($pair.Count -ne 2) { continue }
        $name = $pair[0].Trim() -replace '^export\s+', ''
        $value = $pair[1].Trim()
        if ($value.Length -ge 2 -and (($value[0] -eq '"' -and $value[-1] -eq '"') -or ($value[0] -eq "'" -and $value[-1] -eq "'"))) {
            $value = $value.Substring(1, $value.Length - 2)
        }
        $values[$name] = $value
    }
    return $values
}

function Get-Setting([hashtable]$DotEnv, [string]$Name, [string]$Default) {
    # Same precedence as compose interpolation: the shell's environment, then .env, then the default.
    $fromShell = [Environment]::GetEnvironmentVariable($Name)
    if ($fromShell) { return $fromShell }
    if ($DotEnv.ContainsKey($Name) -and $DotEnv[$Name]) { return $DotEnv[$Name] }
    return $Default
}

function Test-Loopback([string]$HostName) {
    return $HostName -in @('127.0.0.1', 'localhost', '::1') -or $HostName.StartsWith('127.')
}

# Windows PowerShell 5.1 wraps each stderr line of a native command whose stderr is redirected or piped in an
# error record, and with $ErrorActionPreference = 'Stop' the first one ends the script (docker and compose
# write progress to stderr). So docker runs with 'Continue' here, its lines become plain text, and the exit
# code decides. PowerShell 7 behaves the same way with this.
function Invoke-Docker {
    # Streams docker's output (stdout and stderr) to the console; returns docker's exit code.
    $saved = $ErrorActionPreference
    $ErrorActionPreference = 'Continue'
    try {
        & docker @args 2>&1 | ForEach-Object { "$_" } | Out-Host
        return $LASTEXITCODE
    } finally {
        $ErrorActionPreference = $saved
    }
}

function Get-DockerOutput {
    # docker's stdout lines (stderr dropped); the exit code is in $script:DockerExitCode.
    $saved = $ErrorActionPreference
    $ErrorActionPreference = 'Continue'
    try {
        $lines = @(& docker @args 2>$null | ForEach-Object { "$_" })
        $script:DockerExitCode = $LASTEXITCODE
        return $lines
    } finally {
        $ErrorActionPreference = $saved
    }
}

function Start-LogJob([string]$Service) {
    # A service's log as a background job. Lines become plain strings inside the job, so Receive-Job never
    # replays docker's stderr as error records into this script.
    return Start-Job -ScriptBlock {
        param($Dir, $Service)
        Set-Location -LiteralPath $Dir
        $ErrorActionPreference = 'Continue'
        & docker compose logs --follow --no-log-prefix --tail 50 $Service 2>&1 | ForEach-Object { "$_" }
    } -ArgumentList $Repo, $Service
}

# --- Docker Desktop must be running (its WSL2 engine answers `docker version`) ---
$null = Get-DockerOutput version --format '{{.Server.Version}}'
if ($script:DockerExitCode -ne 0) {
    Write-Host 'Docker is not answering. Start Docker Desktop (Settings > General: "Use the WSL 2 based engine"),' -ForegroundColor Red
    Write-Host 'wait until it says "Engine running", then run this again.' -ForegroundColor Red
    exit 1
}

$dotEnv = Read-DotEnv (Join-Path $Repo '.env')
$bind = Get-Setting $dotEnv 'BIND' '127.0.0.1'
$port = Get-Setting $dotEnv 'PORT' '18020'
$monitorPort = Get-Setting $dotEnv 'MONITOR_PORT' '18021'
$webuiPort = Get-Setting $dotEnv 'WEBUI_PORT' '18030'

$profiles = @('--profile', $Mode)
if ($WebUI) { $profiles += @('--profile', 'webui') }
$composeDown = (@('compose') + $profiles + @('down')) -join ' '

# --- Stop the stack when the window is closed (Ctrl+C is handled by the finally block below) ---
# Closing a console window gives its processes about 5 seconds; a detached `docker compose down` outlives it.
Add-Type -TypeDefinition @'
using System;
using System.Diagnostics;
using System.Runtime.InteropServices;
public static class HyperQwenConsole {
    public delegate bool HandlerRoutine(int ctrlType);
    [DllImport("kernel32.dll")]
    static extern bool SetConsoleCtrlHandler(HandlerRoutine handler, bool add);
    static HandlerRoutine handler;
    static string arguments, directory;
    public static void StopOnClose(string composeArguments, string workDirectory) {
        arguments = composeArguments;
        directory = workDirectory;
        handler = new HandlerRoutine(OnEvent);
        SetConsoleCtrlHandler(handler, true);
    }
    static bool OnEvent(int ctrlType) {
        // 2 = window closed, 5 = log off, 6 = shut down. Ctrl+C (0) and Ctrl+Break (1) go to PowerShell.
        if (ctrlType == 2 || ctrlType == 5 || ctrlType == 6) {
            var info = new ProcessStartInfo("docker", arguments);
            info.WorkingDirectory = directory;
            info.UseShellExecute = true;
            info.WindowStyle = ProcessWindowStyle.Hidden;
            Process.Start(info);
        }
        return false;
    }
}
'@
[HyperQwenConsole]::StopOnClose($composeDown, $Repo)

$logJob = $null
$failed = $true
$exitCode = 0
$startLog = Join-Path $Repo 'hyperqwen-start.log'
try {
    Write-Host "Starting HyperQwen ($Mode$(if ($WebUI) { ' + WebUI' }))..." -ForegroundColor Cyan
    # init (folders, key) and prepare (download and requantize; a no-op once done), with prepare's progress shown
    # here: `up -d` of the whole stack would wait silently for prepare to finish.
    $code = Invoke-Docker compose @profiles up -d prepare
    if ($code -ne 0) { throw "docker compose up failed (exit code $code); see the messages above." }
    Write-Host 'Preparing the model (the first start downloads ~20 GB; later starts skip this)...' -ForegroundColor Cyan
    $prepareJob = Start-LogJob 'prepare'
    while ($true) {
        Receive-Job $prepareJob | Out-Host
        $prepareState = (Get-DockerOutput compose @profiles ps --all --format '{{.State}} {{.ExitCode}}' prepare) -join ''
        if ($prepareState -match '^exited (\d+)') { break }
        Start-Sleep -Seconds 2
    }
    Start-Sleep -Seconds 1
    Receive-Job $prepareJob | Out-Host
    Stop-Job $prepareJob -ErrorAction SilentlyContinue
    Remove-Job $prepareJob -Force -ErrorAction SilentlyContinue
    if ($Matches[1] -ne '0') { throw "prepare failed (exit code $($Matches[1])); its log is above." }

    $code = Invoke-Docker compose @profiles up -d
    if ($code -ne 0) { throw "docker compose up failed (exit code $code); see the messages above." }

    # The server's log, streamed into this window while we wait and afterwards.
    $logJob = Start-LogJob $Mode

    $healthUrl = "http://127.0.0.1:$port/health"
    $deadline = (Get-Date).AddMinutes($TimeoutMinutes)
    $healthy = $false
    Write-Host "Waiting for $healthUrl (the first start compiles kernels; later starts take a few minutes)..." -ForegroundColor Cyan
    while ((Get-Date) -lt $deadline) {
        Receive-Job $logJob | Out-Host
        try {
            $response = Invoke-WebRequest -Uri $healthUrl -UseBasicParsing -TimeoutSec 5
            if ($response.StatusCode -eq 200) { $healthy = $true; break }
        } catch { }
        $state = (Get-DockerOutput compose @profiles ps --all --format '{{.Service}} {{.State}} {{.ExitCode}}') -join "`n"
        if ($state -match "(?m)^$Mode exited") { throw "the $Mode server exited; its log is above." }
        if ($state -match '(?m)^prepare exited [1-9]') { throw 'prepare failed; see `docker compose logs prepare`.' }
        Start-Sleep -Seconds 3
    }
    if (-not $healthy) { throw "the server was not healthy after $TimeoutMinutes minutes; its log is above." }

    $page = if ($WebUI) { "http://localhost:$webuiPort/" } else { "http://localhost:$monitorPort/" }
    Write-Host ''
    Write-Host "HyperQwen is up. API: http://localhost:$port/v1   Monitor: http://localhost:$monitorPort/" -ForegroundColor Green
    if ($WebUI) { Write-Host "Chat WebUI: http://localhost:$webuiPort/ (the first account you create is its admin)" -ForegroundColor Green }
    if (-not (Test-Loopback $bind)) {
        Write-Host "BIND=$bind exposes the stack on your network (API key required). From other machines:" -ForegroundColor Yellow
        $addresses = Get-NetIPAddress -AddressFamily IPv4 -ErrorAction SilentlyContinue |
            Where-Object { $_.IPAddress -notlike '127.*' -and $_.IPAddress -notlike '169.254.*' -and
                           $_.InterfaceAlias -notmatch 'vEthernet|WSL|Loopback' }
        foreach ($address in $addresses) {
            Write-Host "  http://$($address.IPAddress):$port/v1   monitor http://$($address.IPAddress):$monitorPort/" -ForegroundColor Yellow
        }
    }
    if (-not $NoBrowser) { Start-Process $page }
    Write-Host 'Following the server log. Press Ctrl+C or close this window to stop HyperQwen.' -ForegroundColor Cyan

    $failed = $false
    while ($true) {
        Receive-Job $logJob | Out-Host
        if ($logJob.State -ne 'Running') {
            Write-Host 'The log stream ended (the server stopped).' -ForegroundColor Yellow
            break
        }
        Start-Sleep -Milliseconds 500
    }
} catch {
    Write-Host "HyperQwen did not start: $($_.Exception.Message)" -ForegroundColor Red
    $exitCode = 1
} finally {
    if ($logJob) { Stop-Job $logJob -ErrorAction SilentlyContinue; Remove-Job $logJob -Force -ErrorAction SilentlyContinue }
    if ($failed) {
        # Keep what the user needs to find the cause: the logs in a file, and the stopped containers (so
        # `docker compose logs prepare` still works). `docker compose down` would delete both.
        Get-DockerOutput compose @profiles logs --no-color --timestamps init prepare $Mode |
            Set-Content -LiteralPath $startLog -Encoding UTF8
        Write-Host "The logs of init, prepare and $Mode are in $startLog (also: docker compose logs prepare)." -ForegroundColor Yellow
        Write-Host 'Stopping HyperQwen (docker compose stop; containers, logs, models and caches are kept)...' -ForegroundColor Cyan
        $null = Invoke-Docker compose @profiles stop
    } else {
        Write-Host 'Stopping HyperQwen (docker compose down; models and caches are kept)...' -ForegroundColor Cyan
        $null = Invoke-Docker compose @profiles down
    }
}
exit $exitCode
